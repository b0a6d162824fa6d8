// Fuzz target for the mangled-name parser (core/inference/kernel_signature.h).
//
// Input: the bytes are a kernel name, as cuFuncGetName could return them.
//
// Checked on every input, the promises of the header:
// - ParseKernelSignature returns (no crash, no hang: libFuzzer's -timeout
//   and the bounded run of fuzz_main.cc), within a bounded stack (the
//   standalone driver runs it on a 1 MiB thread: the parser's recursion
//   bound plus the runtime demangler on a 2 KiB name);
// - the conservative answer: a name that is not `_Z...` or holds a NUL is
//   not parsed; an unparsed signature has no entries and answers kReadWrite
//   (and Pointees::kNone) for every index; For() past the end is kReadWrite;
// - a parsed one has one Pointees entry per parameter, a pointer-table claim
//   only on a pointer parameter (never on a kNone), and agrees with the
//   structural parse alone;
// - where the runtime's demangler prints the name (it is only asked up to
//   2 KiB, and only about names the parser accepts: it runs for minutes on
//   some malformed ones, which this target found), every kRead is printed
//   as a pointer to const, no kNone as a
//   pointer or reference, and every kConst table as a pointer to pointers
//   to const: a read the demangler contradicts would be a missed write.
// A broken check aborts, which libFuzzer and fuzz_main.cc report as a crash.
//
// Built by //core/inference:kernel_signature_fuzz with fuzz_main.cc as a bounded
// regression test, and by `scripts/fuzz.sh kernel_signature` with libFuzzer.
#include <cxxabi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/inference/kernel_signature.h"
#include "tests/support/fuzz_target.h"

namespace stensor {
namespace {

namespace ksi = kernel_signature_internal;

// Larger than the parser's kMaxDemangleLength, so both paths are fuzzed.
constexpr size_t kMaxInputBytes = 8192;
constexpr size_t kDemangleLength = 2048;

void Require(bool condition, const char* what, std::string_view name) {
  if (condition) return;
  std::fprintf(stderr, "kernel_signature_fuzz: %s\n  name: %.*s\n", what,
               static_cast<int>(name.size() > 600 ? 600 : name.size()), name.data());
  std::abort();
}

void Check(std::string_view name) {
  const KernelSignature s = ParseKernelSignature(name);
  const bool mangled =
      name.size() >= 2 && name.substr(0, 2) == "_Z" && name.find('\0') == std::string_view::npos;
  Require(mangled || !s.parsed, "a name that is not _Z... was parsed", name);
  if (!s.parsed) {
    Require(s.params.empty() && s.pointees.empty(), "an unparsed signature has entries", name);
    for (size_t i = 0; i < 4; ++i) {
      Require(s.For(i) == ParamAccess::kReadWrite,
              "an unparsed signature answers other than read-write", name);
      Require(s.PointeesFor(i) == Pointees::kNone, "an unparsed signature claims a pointer table",
              name);
    }
    return;
  }
  Require(s.pointees.size() == s.params.size(), "one Pointees entry per parameter", name);
  Require(s.For(s.params.size()) == ParamAccess::kReadWrite, "For() past the end is not read-write",
          name);
  for (size_t i = 0; i < s.params.size(); ++i) {
    Require(s.For(i) == s.params[i], "For() is not params[i]", name);
    Require(s.pointees[i] == Pointees::kNone || s.params[i] != ParamAccess::kNone,
            "a pointer table on a parameter that is not a pointer", name);
  }
  std::vector<Pointees> pointees;
  const std::optional<std::vector<ParamAccess>> alone = ksi::ClassifyMangledParams(name, &pointees);
  Require(alone.has_value() && *alone == s.params,
          "the signature differs from the structural parse", name);

  // The demangler is only asked about parsed names (it can hang on some
  // malformed ones): this point is reached only for those.
  if (name.size() > kDemangleLength) return;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(std::string(name).c_str(), nullptr, nullptr, &status), &std::free);
  if (demangled == nullptr || status != 0) return;
  Require(ksi::DemangledParamsAgree(demangled.get(), s.params),
          "a read or none the demangler contradicts", name);
  Require(s.demangled_name == demangled.get(), "demangled_name is not the demangler's", name);
}

}  // namespace

namespace fuzz {
namespace {

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds = {
      // From core/kernel_signature_test.cc.
      "_Z1fPPf",
      "_Z1bIVKfEvPT_",
      "_Z5scaleIPfEvPT_S1_i",
      "_Z1gIN1SUt_EiEvT_PT0_S3_",
      "_Z6k_enum4Mode5PlainPKS_",
      "_Z8long_litIyEvPKT_PS0_y",
      "_Z8k_arrptrPA16_fPA16_Kfi",
      "_Z9k_voidptrPvPKvPS_PKS1_",
      "_ZN3mlp11init_paramsEPfijf",
      "_Z1hDF16_PKDF16_DuPKDugCfDn",
      "_Z8pack_twoIJfiEEvDpPT_DpPKS0_",
      "_Z11nontype_valIlLln5EEvPKT_PS0_",
      "_Z5tiledIfLi128ELb1EEvPKT_PS0_S0_",
      "_ZN3mlp12sgd_momentumEPfS0_PKfffi",
      "_ZN12_GLOBAL__N_111anon_kernelEPKfPfi",
      "_Z10k_builtinsbcahstijlmxyfdnowDsDiDnPe",
      "_Z13k_subst_chainPKfS0_PfS1_PKiS3_PiS4_",
      "_Z11array_paramILi3EEv5ArrayIfXT_EEPKS1_",
      "_Z18k_const_struct_ptrPK6ParamsS1_PS_S_S_",
      "_ZN3mlp21linear_backward_inputEPKfS1_Pfiii",
      "_ZN3cub17CUB_300001_SM_9006detail11EmptyKernelIvEEvv",
      "_Z9tmpl_tmplI6HolderfEvT_IT0_EPKS2_PS3_",
      "_Z1cPrPKfPKPf",
      "_Z1dPA4_KfPFiPKiE",
      "_Z1hIZ3usevEUliE_EvPT_PKS1_",
      "_ZN1n1kIZNS_1uEvEUlPfE_EEvT_S1_PKf",
      "_Z1vDv4_fPKS_PS_",
      "_Z2mpM1AiMS_FvvEPKi",
      "_Z2pkIJEEvDpT_",
      "_Z1fPKPKfPPKfPKPf",
      "_Z6kernelPKfPf.cold",
      "kernel_extern_c",
      // From the CUDA 13 libraries (core/inference/testdata/kernel_names.txt.gz).
      "_Z14RNN_persist_fpI6__halfS0_fL14cudnnRNNMode_t0ELb0ELi1024ELi1ELi7ELi7E"
      "Li32ELi0ELi32ELi1ELi1ELi32ELi32ELi8ELi8ELi1ELi1ELi2ELi1ELi1ELb0ELi65536E"
      "Li65536ELi1EEv15persist_fp_argsIS0_S0_E",
      "_Z17trmm2_kernel_coreIi6float2Li256ELi4ELb0ELb0ELb1ELb0ELb1ELb1EEv17cubl"
      "asTrmm2ParamsIT_T0_ES3_i",
      "_Z27RNN_blockPersist_bp_RNN_FMAI6__halfS0_fLi128EEv17block_bp_args_rnnIT"
      "_T0_E",
      "_ZN5cudnn3gnn21bwd_basis_post_kernelIdlLb0ELb0ELb1ELb0ELi2ELi8EEEvPT_S3_"
      "PKS2_S5_S5_iiT0_PKS6_S8_S8_PKiii",
      "_ZN7cutlass7Kernel2I64cutlass_75_tensorop_s1688gemm_planar_complex_f16_6"
      "4x64_tn_align1EEvNT_6ParamsE",
      "_ZN8cusparse17coomm_alg3_kernelILb1ELb1ELb1EllNS_7ComplexI6__halfEES3_S3"
      "_NS1_IfEEEEvT2_S5_NS_12KernelCoeffsIT7_EEiiPKT3_SB_PKT4_lPKT5_S5_lPT6_S5"
      "_l",
      "_Z13gen_sequencedI15curandStateTestdiXadL_Z28curand_uniform_double_noarg"
      "sIS0_EdPT_iEE10rng_configIS0_L14curandOrdering101EEEvS3_PT0_mmT1_",
  };
  // Deep nesting and long names: the recursion and length bounds.
  seeds.push_back("_Z1f" + std::string(3000, 'P') + "Kf");
  std::string templates = "_Z1f";
  for (int i = 0; i < 1000; ++i) templates += "N1AI";
  seeds.push_back(templates);
  std::string long_params = "_Z1f";
  for (int i = 0; i < 1200; ++i) long_params += "PKf";
  seeds.push_back(long_params);  // 3,604 bytes: past the demangler's limit
  return seeds;
}

}  // namespace

const FuzzTarget& Target() {
  static const FuzzTarget* const target = new FuzzTarget{
      "kernel_signature_fuzz",
      Seeds(),
      {"_Z",     "N",
       "E",      "I",
       "J",      "K",
       "V",      "r",
       "P",      "R",
       "O",      "S_",
       "S0_",    "S1_",
       "SA_",    "T_",
       "T0_",    "T1_",
       "Dp",     "L",
       "Li1E",   "Lb0E",
       "X",      "ad",
       "L_Z",    "F",
       "A16_",   "M",
       "Dv4_",   "Ut_",
       "UlPfE_", "Z",
       "v",      "f",
       "i",      "6__half",
       "3mlp",   "12_GLOBAL__N_1",
       "DF16_",  "u3foo",
       "St",     "Sa",
       ".cold",  "PKf",
       "PPf"},
      kMaxInputBytes,
      // The parser's recursion bound costs about 32 KiB, the demangler about
      // 100 bytes per character of a 2 KiB name: 1 MiB holds both with room.
      size_t{1} << 20,
  };
  return *target;
}

}  // namespace fuzz
}  // namespace stensor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stensor::Check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
