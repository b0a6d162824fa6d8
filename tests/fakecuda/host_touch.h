// HostTouches: which pages of host-located VMM mappings a kernel touches,
// so that the time model (FAKECUDA_LINK) charges a kernel reading through a
// host mapping for the bytes it reads, as a GPU's link carries them, not for
// the whole mapping.
//
// While the kernel's host function runs, the pages of the mappings its
// pointer parameters reach are protected (PROT_NONE) at their device
// addresses, and only there: the same memory mapped elsewhere (stensor's
// host copy, read by its swap copies on other streams) is untouched. A
// SIGSEGV handler counts the first touch of each page by the thread that
// runs the kernel, gives the page its access back, and lets the access run
// again; a touch of the page right after the ones the previous touch opened
// opens (and counts) twice as many, up to 64, since a trap per page would
// cost the kernel far more than the link time it is charged. A touch by any other thread (a copy on
// another stream, another kernel) also gets the page back, uncounted. Faults that are not on a
// watched page go to the handler installed before this one (the default
// action if none), so a touch of unmapped memory still kills the program.
//
// Robustness: where a mapping cannot be watched (no free slot, the handler
// replaced by someone else's, SIGSEGV blocked on the thread, mprotect
// failing), it is charged whole, as before this counting existed; where
// restoring one page at a time runs out of kernel mappings (vm.max_map_count),
// the whole mapping gets its access back and is charged whole.
// cuMemUnmap and cuMemSetAccess call ForgetHostTouches before they change a
// range, which gives it its access back and stops watching it.
//
// Thread-safety: a HostTouches belongs to the thread that runs the kernel.
// The shared watch table is guarded by a spin lock that the signal handler
// takes too (it never faults while held).
#ifndef STENSOR_TESTS_FAKECUDA_HOST_TOUCH_H_
#define STENSOR_TESTS_FAKECUDA_HOST_TOUCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fakecuda {

class HostTouches {
 public:
  HostTouches() = default;
  ~HostTouches() { (void)Finish(); }
  HostTouches(const HostTouches&) = delete;
  HostTouches& operator=(const HostTouches&) = delete;

  // Starts watching [start, start + size), a host-located mapping with
  // access `prot` (as cuMemSetAccess set it), for the calling thread. Called
  // with the fake's memory lock held, so that the mapping cannot change
  // between its lookup and the protection. One that cannot be watched
  // counts whole.
  void Watch(uintptr_t start, size_t size, int prot);
  bool empty() const { return slots_.empty() && whole_bytes_ == 0; }

  struct Result {
    size_t bytes = 0;         // touched pages, and mappings counted whole
    size_t mapped_bytes = 0;  // of every mapping watched or counted
    size_t faults = 0;        // the page faults that counted the touches
  };
  // Stops watching; the pages get their access back (unless another kernel
  // still watches the same mapping). Later calls return an empty Result.
  Result Finish();

 private:
  struct Held {
    int slot;
    uint32_t generation;
  };
  std::vector<Held> slots_;
  size_t whole_bytes_ = 0;
  size_t mapped_bytes_ = 0;
};

// [start, start + size) is about to be unmapped or have its access changed:
// what watches it stops, its watched pages get their access back first.
// Called with the fake's memory lock held.
void ForgetHostTouches(uintptr_t start, size_t size);

}  // namespace fakecuda

#endif  // STENSOR_TESTS_FAKECUDA_HOST_TOUCH_H_
