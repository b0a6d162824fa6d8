// Fake driver: the pages a kernel touches through host-located mappings
// (host_touch.h).
#include "tests/fakecuda/host_touch.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "tests/fakecuda/internal.h"

namespace fakecuda {
namespace {

// Mappings watched at once at most (kernels in flight on all streams times
// the mappings each reaches, plus the retired ones kept, see kRetired).
constexpr int kSlots = 256;

// A touch of the page right after the pages the last touch opened opens
// twice as many (up to this many), as readahead does: a trap costs about
// 20 us here and the pages' page tables rebuilt after it about 4 us each,
// so one trap a page would bill a kernel reading a buffer end to end about
// 6 times what the link charges for it (4 us a page at 1 GB/s). An
// isolated touch still counts its one page; a sequential read of n pages
// takes about log2(n) + n / kMaxRunPages traps and is charged at most
// kMaxRunPages - 1 pages it did not reach.
constexpr size_t kMaxRunPages = 64;

enum class State : uint8_t {
  kFree,
  // Watched for `owner`: its pages are PROT_NONE until touched.
  kArmed,
  // Watched no longer, its access given back; its pages may still fault
  // for a moment in a thread that touched one just before (the handler
  // runs after the restore): such a fault is retried, not passed on. Kept
  // until the range is unmapped or its access changed (ForgetHostTouches),
  // or the slot is needed.
  kRetired,
  // Unmapped or its access changed while armed: never ours again; kept for
  // its owner's Finish to read the count.
  kForgotten,
};

struct Slot {
  State state = State::kFree;
  uintptr_t start = 0, end = 0;
  int prot = PROT_NONE;  // the mapping's own access, given back
  pid_t owner = 0;
  uint32_t generation = 0;
  uint64_t* touched = nullptr;  // one bit per page; only while kArmed/kForgotten
  size_t next_page = 0;         // after the pages the owner's last touch opened
  size_t run_pages = 0;         // how many that touch opened
  size_t faults = 0;            // the owner's, counted
  bool whole = false;           // its access went back whole: counted whole
  uint64_t retired = 0;         // order of retirement, oldest reused first
};

// Guarded by the spin lock: the handler takes it, so no mutex.
Slot g_slots[kSlots];
uint32_t g_generation = 0;
uint64_t g_retirements = 0;
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;

// Set once, before the handler is installed; read by the handler.
struct sigaction g_previous;
std::once_flag g_install_once;
bool g_installed = false;

class SpinLock {
 public:
  SpinLock() {
    while (g_lock.test_and_set(std::memory_order_acquire)) sched_yield();
  }
  ~SpinLock() { g_lock.clear(std::memory_order_release); }
};

pid_t ThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

size_t Pages(const Slot& s) { return (s.end - s.start) / kPageSize; }

size_t TouchedBytes(const Slot& s) {
  if (s.whole || s.touched == nullptr) return s.end - s.start;
  size_t pages = 0;
  for (size_t w = 0; w < (Pages(s) + 63) / 64; ++w) {
    pages += static_cast<size_t>(__builtin_popcountll(s.touched[w]));
  }
  return pages * kPageSize;
}

bool ArmedElsewhere(const Slot& self) {
  for (const Slot& s : g_slots) {
    if (&s != &self && s.state == State::kArmed && s.start == self.start && s.end == self.end) {
      return true;
    }
  }
  return false;
}

// Passes a fault that is not ours on, as if this handler were not there.
void Chain(int sig, siginfo_t* info, void* context) {
  const struct sigaction& p = g_previous;
  if ((p.sa_flags & SA_SIGINFO) != 0 && p.sa_sigaction != nullptr) {
    p.sa_sigaction(sig, info, context);
    return;
  }
  if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    p.sa_handler(sig);
    return;
  }
  // The default action (an ignored SIGSEGV from a fault is fatal too): the
  // access runs again, faults again and ends the process with SIGSEGV.
  signal(SIGSEGV, SIG_DFL);
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  bool ours = false;
  {
    SpinLock lock;
    const pid_t self = ThreadId();
    Slot* counted = nullptr;
    Slot* any = nullptr;
    for (Slot& s : g_slots) {
      if ((s.state != State::kArmed && s.state != State::kRetired) || addr < s.start ||
          addr >= s.end) {
        continue;
      }
      any = &s;
      if (s.state == State::kArmed && s.owner == self && s.touched != nullptr) counted = &s;
    }
    if (any != nullptr) {
      ours = true;
      const uintptr_t page = addr & ~(uintptr_t{kPageSize} - 1);
      size_t pages = 1;  // a touch by another thread: its page only, uncounted
      if (counted != nullptr) {
        const size_t first = (page - counted->start) / kPageSize;
        pages = first == counted->next_page && counted->run_pages > 0
                    ? std::min(2 * counted->run_pages, kMaxRunPages)
                    : 1;
        pages = std::min(pages, Pages(*counted) - first);
        for (size_t i = first; i < first + pages; ++i) {
          counted->touched[i / 64] |= uint64_t{1} << (i % 64);
        }
        counted->next_page = first + pages;
        counted->run_pages = pages;
        ++counted->faults;
      }
      if (mprotect(reinterpret_cast<void*>(page), pages * kPageSize, any->prot) != 0) {
        // Out of kernel mappings (each restored page may split one): the
        // whole range gets its access back and is counted whole.
        if (mprotect(reinterpret_cast<void*>(any->start), any->end - any->start, any->prot) == 0) {
          for (Slot& s : g_slots) {
            if (s.state == State::kArmed && s.start == any->start && s.end == any->end) {
              s.whole = true;
            }
          }
        } else {
          ours = false;  // nothing left to do but what would happen anyway
        }
      }
    }
  }
  errno = saved_errno;
  if (!ours) Chain(sig, info, context);
}

void Install() {
  struct sigaction act;
  std::memset(&act, 0, sizeof(act));
  act.sa_sigaction = OnSegv;
  act.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&act.sa_mask);
  g_installed = sigaction(SIGSEGV, &act, &g_previous) == 0;
}

// Whether a fault on this thread would reach OnSegv: installed, not
// replaced since (a handler installed later, which may not chain to this
// one), and SIGSEGV not blocked here.
bool HandlerInPlace() {
  std::call_once(g_install_once, Install);
  if (!g_installed) return false;
  struct sigaction now;
  if (sigaction(SIGSEGV, nullptr, &now) != 0 || (now.sa_flags & SA_SIGINFO) == 0 ||
      now.sa_sigaction != OnSegv) {
    return false;
  }
  sigset_t blocked;
  return pthread_sigmask(SIG_SETMASK, nullptr, &blocked) == 0 &&
         sigismember(&blocked, SIGSEGV) == 0;
}

// A slot for a new watch of [start, end): a retired one of the same range,
// a free one, or the oldest retired one. Needs the lock.
Slot* TakeSlot(uintptr_t start, uintptr_t end) {
  Slot* free_slot = nullptr;
  Slot* oldest = nullptr;
  for (Slot& s : g_slots) {
    if (s.state == State::kRetired && s.start == start && s.end == end) return &s;
    if (s.state == State::kFree && free_slot == nullptr) free_slot = &s;
    if (s.state == State::kRetired && (oldest == nullptr || s.retired < oldest->retired)) {
      oldest = &s;
    }
  }
  return free_slot != nullptr ? free_slot : oldest;
}

}  // namespace

void HostTouches::Watch(uintptr_t start, size_t size, int prot) {
  mapped_bytes_ += size;
  // Only read-write mappings: a page given back read-only would fault again
  // at a write, and a mapping without access faults whatever this does.
  if (size == 0 || start % kPageSize != 0 || size % kPageSize != 0 ||
      prot != (PROT_READ | PROT_WRITE) || !HandlerInPlace()) {
    whole_bytes_ += size;
    return;
  }
  static thread_local pid_t self = ThreadId();
  auto* touched = new uint64_t[(size / kPageSize + 63) / 64]();
  uint64_t* to_free = nullptr;
  bool watched = false;
  {
    SpinLock lock;
    if (Slot* s = TakeSlot(start, start + size)) {
      to_free = s->touched;  // a retired slot's (none: freed when retired)
      *s = Slot{};
      s->start = start;
      s->end = start + size;
      s->prot = prot;
      s->owner = self;
      s->generation = ++g_generation;
      s->touched = touched;
      if (mprotect(reinterpret_cast<void*>(start), size, PROT_NONE) == 0) {
        s->state = State::kArmed;
        slots_.push_back(Held{static_cast<int>(s - g_slots), s->generation});
        watched = true;
      } else {
        (void)mprotect(reinterpret_cast<void*>(start), size, prot);  // partly done
        s->touched = nullptr;
        s->state = State::kFree;
      }
    }
  }
  delete[] to_free;
  if (!watched) {
    delete[] touched;
    whole_bytes_ += size;
  }
}

HostTouches::Result HostTouches::Finish() {
  Result r;
  r.bytes = whole_bytes_;
  r.mapped_bytes = mapped_bytes_;
  std::vector<uint64_t*> to_free;
  {
    SpinLock lock;
    for (const Held& h : slots_) {
      Slot& s = g_slots[h.slot];
      if (s.generation != h.generation ||
          (s.state != State::kArmed && s.state != State::kForgotten)) {
        continue;
      }
      r.bytes += TouchedBytes(s);
      r.faults += s.faults;
      to_free.push_back(s.touched);
      s.touched = nullptr;
      if (s.state == State::kForgotten) {
        s.state = State::kFree;
        continue;
      }
      if (!ArmedElsewhere(s)) {
        (void)mprotect(reinterpret_cast<void*>(s.start), s.end - s.start, s.prot);
      }
      s.state = State::kRetired;
      s.retired = ++g_retirements;
    }
  }
  for (uint64_t* p : to_free) delete[] p;
  slots_.clear();
  whole_bytes_ = 0;
  mapped_bytes_ = 0;
  return r;
}

void ForgetHostTouches(uintptr_t start, size_t size) {
  SpinLock lock;
  for (Slot& s : g_slots) {
    if (s.state == State::kFree || s.end <= start || s.start >= start + size) continue;
    if (s.state == State::kArmed) {
      // Its access back before the range changes (an unmap's mremap must
      // find one kernel mapping, not pieces); the owner's Finish reads the
      // count.
      (void)mprotect(reinterpret_cast<void*>(s.start), s.end - s.start, s.prot);
      s.state = State::kForgotten;
    } else if (s.state == State::kRetired) {
      s.state = State::kFree;
    }
  }
}

}  // namespace fakecuda
