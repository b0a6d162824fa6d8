// Read/write classification of kernel parameters from Itanium-mangled names.
//
// stensor must know, for every kernel launch, which of the buffers the
// parameters point to the kernel may write: a write makes the host copy of a
// buffer stale, so its next eviction costs a transfer. The parameter layout
// (offsets and sizes) comes from cuFuncGetParamInfo; this module supplies the
// other half, one classification per top-level parameter, in declaration
// order, derived from the mangled name that cuFuncGetName returns:
//
//   _ZN3mlp12sgd_momentumEPfS0_PKfffi
//     = mlp::sgd_momentum(float*, float*, float const*, float, float, int)
//     -> {kReadWrite, kReadWrite, kRead, kNone, kNone, kNone}
//
// The rule (docs/design.md, S01): a pointer to const (`PK...`) is a
// read; a non-const pointer, a reference, anything passed by value that may
// hold a pointer (struct, class, union, enum, array, unknown types) is a
// read-write; an arithmetic builtin is kNone. Names that are not mangled C++
// (extern "C" kernels) or that the parser does not fully understand come back
// with parsed == false, and then every parameter counts as read-write: the
// module never guesses a read.
//
// Where the demangler of the C++ runtime (abi::__cxa_demangle) handles the
// name, a parse is only accepted when the two agree on the number of
// parameters and on the printed type of every kRead and kNone parameter, so
// a bug in either one degrades to the conservative answer instead of a
// missed write. Names it gives up on (it has a fixed budget, exceeded by
// large CUTLASS kernels) or that are longer than 2 KiB (its stack use grows
// with the name) rely on the parser alone.
//
// Limitations, all on the conservative side: a pointer to an array of const
// (`const float (*)[16]`) or to a qualified function type counts as
// read-write, and so does every enum, union and vector type by value (the
// mangling does not tell them from structs). Generic lambdas with explicit
// template heads, `srN` dependent names, _BitInt and C++20 module names are
// not parsed at all (parsed == false).
//
// Thread-safety: ParseKernelSignature is a pure function of its argument and
// may be called from any thread concurrently. It allocates, so callers cache
// the result per kernel (it is computed once per distinct CUfunction).
#ifndef STENSOR_CORE_INFERENCE_KERNEL_SIGNATURE_H_
#define STENSOR_CORE_INFERENCE_KERNEL_SIGNATURE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stensor {

// How a kernel may access the buffers one parameter refers to.
enum class ParamAccess : uint8_t {
  // The declared type is an arithmetic builtin (int, float, size_t, ...), not
  // a pointer. A 64-bit integer can still carry an address the program cast
  // away; a caller that scans every parameter word anyway should treat a hit
  // in a kNone parameter as read-write.
  kNone,
  // A pointer to const (`const T*`, `T* const*`): the kernel cannot write
  // the pointed-to buffer without a cast.
  kRead,
  // A non-const pointer, a reference, a struct/class/union/enum/array by
  // value (it may contain pointers), or anything not understood.
  kReadWrite,
};

// What a parameter that points to pointers (a pointer table: `T**`,
// `T* const*`, `T const* const*`; a reference is a level like a pointer, so
// `T*&` is one too) lets the kernel do to the buffers the
// table's entries point to.
enum class Pointees : uint8_t {
  kNone,      // not a pointer to pointers
  kConst,     // `T const* const*`, `T const**`, `T const* const&`: the
              // targets are only read
  kWritable,  // `T**`, `T* const*`, `T const**&`, or not understood
};

// "none", "read" or "read-write", for logs and test messages.
const char* ParamAccessName(ParamAccess access);

struct KernelSignature {
  // The demangled name, or the raw name when it is not a mangled C++ name
  // the parser accepts (the runtime's demangler is not asked about names the
  // parser rejects: it can run for minutes on some malformed ones).
  std::string demangled_name;
  // True when `params` holds one entry per parameter. False for extern "C"
  // kernels and for names that could not be parsed; then For() answers
  // kReadWrite for every index.
  bool parsed = false;
  // One entry per top-level parameter, in order; pack expansions
  // (`Args... args`) are expanded. Empty unless `parsed`.
  std::vector<ParamAccess> params;
  // Per parameter, like `params`: whether it points to pointers, and what
  // the kernel may do to their targets. Empty unless `parsed`.
  std::vector<Pointees> pointees;

  // The access of parameter `index`: kReadWrite when the signature was not
  // parsed or `index` is out of range (the conservative answer).
  ParamAccess For(size_t index) const;
  // The pointees of parameter `index`: kNone when not parsed (a caller then
  // knows nothing about the parameter's type and must treat a table it
  // reaches as written).
  Pointees PointeesFor(size_t index) const;
};

// Classifies the parameters of the kernel whose (Itanium-mangled) name is
// `mangled`. Never fails and never aborts: arbitrary bytes are safe input.
KernelSignature ParseKernelSignature(std::string_view mangled);

// Exposed for tests and the fuzz-style robustness test only.
namespace kernel_signature_internal {

// The structural parse alone, without the cross-check against the runtime's
// demangler: the classification of each parameter of `mangled`, or nullopt
// when it is not a mangled function name the parser fully understands.
std::optional<std::vector<ParamAccess>> ClassifyMangledParams(std::string_view mangled);
// The same parse, also giving each parameter's Pointees.
std::optional<std::vector<ParamAccess>> ClassifyMangledParams(std::string_view mangled,
                                                              std::vector<Pointees>* pointees);

// True when the demangler printed `type` as a pointer (or reference) to
// pointers to const ("float const* const*", "float const**",
// "float const* const&").
bool PrintedAsPointerToPointerToConst(std::string_view type);

// The cross-check: true when `demangled` (as printed by abi::__cxa_demangle)
// has exactly params.size() parameters, every kRead one is printed as a
// pointer to const and no kNone one is printed as a pointer or reference.
bool DemangledParamsAgree(std::string_view demangled, const std::vector<ParamAccess>& params);

}  // namespace kernel_signature_internal
}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_KERNEL_SIGNATURE_H_
