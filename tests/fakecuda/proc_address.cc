// Fake driver: cuGetProcAddress, mapping a base name, a CUDA version and the
// stream flags to the exported symbol of that ABI, as the real driver does
// (cuMemAlloc at 3020 is cuMemAlloc_v2; cuLaunchKernel with the per-thread
// flag is cuLaunchKernel_ptsz). The table is generated from cudaTypedefs.h
// (gen_proc_table.py); an entry the fake does not export reads as not found.
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <unordered_map>

#include "tests/fakecuda/internal.h"

namespace fakecuda {
namespace {

struct ProcEntry {
  const char* name;
  int version;      // first CUDA version with this ABI
  bool per_thread;  // the _ptds/_ptsz variant
  const char* symbol;
};

constexpr ProcEntry kProcs[] = {
#define FAKECUDA_PROC(name, version, per_thread, symbol) {#name, version, per_thread != 0, #symbol},
#include "tests/fakecuda/proc_table.inc"
#undef FAKECUDA_PROC
};

const std::unordered_multimap<std::string, const ProcEntry*>& ByName() {
  static const auto* index = [] {
    auto* m = new std::unordered_multimap<std::string, const ProcEntry*>;
    for (const ProcEntry& e : kProcs) m->emplace(e.name, &e);
    return m;
  }();
  return *index;
}

// This library's own handle: symbols resolve here, never to an interposer.
void* Self() {
  static void* self = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&ByName), &info);
    return dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  }();
  return self;
}

// The C library's dlsym: an interposer (stensor) exports its own, which may
// answer with its hooks or build its state by calling back into this driver.
using DlsymFn = void* (*)(void*, const char*);
DlsymFn LibcDlsym() {
  static DlsymFn fn = [] {
    void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(f);
  }();
  return fn;
}

template <typename Range>
bool HasPerThread(const Range& range) {
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second->per_thread) return true;
  }
  return false;
}

// A name not found at this version: the 4-argument form answers
// CUDA_ERROR_NOT_FOUND, cuGetProcAddress_v2 (`v2`) CUDA_SUCCESS with a null
// pointer and the reason in its status, as documented and as driver 580
// answered on an H200.
CUresult Lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status, bool v2) {
  if (symbol == nullptr || pfn == nullptr ||
      (flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pfn = nullptr;
  const bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const ProcEntry* plain = nullptr;
  const ProcEntry* threaded = nullptr;
  bool known = false;
  auto range = ByName().equal_range(symbol);
  for (auto it = range.first; it != range.second; ++it) {
    const ProcEntry* e = it->second;
    known = true;
    if (e->version > version) continue;
    const ProcEntry*& best = e->per_thread ? threaded : plain;
    if (best == nullptr || e->version > best->version) best = e;
  }
  const ProcEntry* chosen = plain;
  // The per-thread variant only where it has the same ABI as the newest
  // plain one available at this version. An entry point that has per-thread
  // variants but none yet at this version is not found with the per-thread
  // flag (the real driver answers so: cuMemcpy at 4000, cuMemsetD8 at 3020),
  // rather than given its legacy-stream variant.
  if (per_thread && threaded != nullptr &&
      (plain == nullptr || threaded->version >= plain->version)) {
    chosen = threaded;
  } else if (per_thread && threaded == nullptr && HasPerThread(range)) {
    chosen = nullptr;
  }
  void* fn = chosen ? dlsym(Self(), chosen->symbol) : nullptr;
  if (status != nullptr) {
    *status = fn != nullptr                  ? CU_GET_PROC_ADDRESS_SUCCESS
              : (known && chosen == nullptr) ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                             : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  if (fn == nullptr) return v2 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  *pfn = fn;
  return CUDA_SUCCESS;
}

}  // namespace

bool IsExportedSymbol(const char* symbol) {
  DlsymFn real = LibcDlsym();
  if (real != nullptr && Self() != nullptr) return real(Self(), symbol) != nullptr;
  // No way past an interposer: a name of the driver API is accepted.
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.symbol, symbol) == 0) return true;
  }
  return false;
}

}  // namespace fakecuda

FAKECUDA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  FAKECUDA_ENTER_NO_INIT("cuGetProcAddress_v2");
  return fakecuda::Lookup(symbol, pfn, cudaVersion, flags, symbolStatus, /*v2=*/true);
}

FAKECUDA_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags) {
  FAKECUDA_ENTER_NO_INIT("cuGetProcAddress");
  return fakecuda::Lookup(symbol, pfn, cudaVersion, flags, nullptr, /*v2=*/false);
}
