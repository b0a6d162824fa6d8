#include "core/inference/kernel_signature.h"

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

using kernel_signature_internal::ClassifyMangledParams;
using kernel_signature_internal::DemangledParamsAgree;

constexpr ParamAccess kNone = ParamAccess::kNone;
constexpr ParamAccess kRead = ParamAccess::kRead;
constexpr ParamAccess kReadWrite = ParamAccess::kReadWrite;

// A real mangled kernel name and the access of each parameter, one letter
// each: 'n' kNone, 'r' kRead, 'w' kReadWrite. The comment above each entry
// is the demangled signature (template arguments elided).
struct NameCase {
  const char* mangled;
  const char* expected;
};

std::string Letters(const std::vector<ParamAccess>& params) {
  std::string letters;
  for (ParamAccess access : params) {
    letters += access == kNone ? 'n' : access == kRead ? 'r' : 'w';
  }
  return letters;
}

void ExpectSignature(const NameCase& c) {
  SCOPED_TRACE(c.mangled);
  const KernelSignature signature = ParseKernelSignature(c.mangled);
  ASSERT_TRUE(signature.parsed) << signature.demangled_name;
  EXPECT_EQ(Letters(signature.params), c.expected) << signature.demangled_name;
  for (size_t i = 0; i < signature.params.size(); ++i) {
    EXPECT_EQ(signature.For(i), signature.params[i]);
  }
  EXPECT_EQ(signature.For(signature.params.size()), kReadWrite);
  // The structural parse alone gives the same answer (the cross-check with
  // the runtime's demangler only ever turns a parse down).
  const auto structural = ClassifyMangledParams(c.mangled);
  ASSERT_TRUE(structural.has_value());
  EXPECT_EQ(*structural, signature.params);
}

// All kernels of examples/mlp/mlp_kernels.cu, as nvcc 13.0 names them
// (nvcc -cubin -arch=sm_90; readelf -sW, FUNC GLOBAL symbols). The fake
// driver's host twins in mlp_kernels_host.cc carry the same names.
constexpr NameCase kMlpExample[] = {
    // mlp::init_params(float*, int, unsigned int, float)
    {"_ZN3mlp11init_paramsEPfijf", "wnnn"},
    // mlp::synth_shard(float*, int*, int, int, int, int, unsigned int,
    //   float)
    {"_ZN3mlp11synth_shardEPfPiiiiijf", "wwnnnnnn"},
    // mlp::gather_batch(float const*, int const*, float*, int*, int, int,
    //   int)
    {"_ZN3mlp12gather_batchEPKfPKiPfPiiii", "rrwwnnn"},
    // mlp::relu_forward(float const*, float*, int)
    {"_ZN3mlp12relu_forwardEPKfPfi", "rwn"},
    // mlp::sgd_momentum(float*, float*, float const*, float, float, int)
    {"_ZN3mlp12sgd_momentumEPfS0_PKfffi", "wwrnnn"},
    // mlp::softmax_xent(float const*, int const*, float*, float*, int, int)
    {"_ZN3mlp12softmax_xentEPKfPKiPfS4_ii", "rrwwnn"},
    // mlp::relu_backward(float const*, float*, int)
    {"_ZN3mlp13relu_backwardEPKfPfi", "rwn"},
    // mlp::linear_forward(float const*, float const*, float const*, float*,
    //   int, int, int)
    {"_ZN3mlp14linear_forwardEPKfS1_S1_Pfiii", "rrrwnnn"},
    // mlp::linear_backward_input(float const*, float const*, float*, int,
    //   int, int)
    {"_ZN3mlp21linear_backward_inputEPKfS1_Pfiii", "rrwnnn"},
    // mlp::linear_backward_params(float const*, float const*, float*,
    //   float*, int, int, int)
    {"_ZN3mlp22linear_backward_paramsEPKfS1_PfS2_iii", "rrwwnnn"},
    // mlp::mean_loss(float const*, float*, int)
    {"_ZN3mlp9mean_lossEPKfPfi", "rwn"},
};

// nvcc 13.0 -cubin -arch=sm_90 -std=c++17 of a throwaway .cu with kernels
// covering const/non-const/__restrict__/volatile pointers, pointers to
// pointers, structs/enums/vector types/__half by value, every builtin type,
// function and array pointers, function templates (return type before the
// parameters), non-type and template template arguments, enum literals,
// dependent types, pack expansions, nested and anonymous namespaces (nvcc
// spells the latter _GLOBAL__N__<hash>).
constexpr NameCase kNvccKernels[] = {
    // fnptr_tmpl<...>(float const*, float*)
    {"_Z10fnptr_tmplIXadL_Z6dev_fnfEEEvPKfPf", "rw"},
    // k_builtins(bool, char, signed char, unsigned char, short, unsigned
    //   short, int, unsigned int, long, unsigned long, long long, unsigned
    //   long long, float, double, __int128, unsigned __int128, wchar_t,
    //   char16_t, char32_t, decltype(nullptr), long double*)
    {"_Z10k_builtinsbcahstijlmxyfdnowDsDiDnPe", "nnnnnnnnnnnnnnnnnnnnw"},
    // k_restrict(float const*, float*, int)
    {"_Z10k_restrictPKfPfi", "rwn"},
    // k_volatile(float volatile*, float const volatile*, int volatile*)
    {"_Z10k_volatilePVfPVKfPVi", "wrw"},
    // sizeof_dep<...>(float const*, float (*) [(4)*(2)])
    {"_Z10sizeof_depILi4EEvPKfPAmlT_Li2E_f", "rw"},
    // array_param<...>(Array<float, 3>, Array<float, 3> const*)
    {"_Z11array_paramILi3EEv5ArrayIfXT_EEPKS1_", "wr"},
    // k_const_ptr(float const*, float*, int)
    {"_Z11k_const_ptrPKfPfi", "rwn"},
    // nontype_val<...>(bool const*, bool*)
    {"_Z11nontype_valIbLb0EEvPKT_PS0_", "rw"},
    // nontype_val<...>(char const*, char*)
    {"_Z11nontype_valIcLc97EEvPKT_PS0_", "rw"},
    // nontype_val<...>(long const*, long*)
    {"_Z11nontype_valIlLln5EEvPKT_PS0_", "rw"},
    // k_const_char(char const*, char*, unsigned char const*, signed char
    //   const*)
    {"_Z12k_const_charPKcPcPKhPKa", "rwrr"},
    // variadic_mix<...>(float*, int const*, double const*)
    {"_Z12variadic_mixIfJidEEvPT_DpPKT0_", "wrr"},
    // holder_kernel<...>(Holder<float>, Holder<float> const*, float const*,
    //   Holder<float const>)
    {"_Z13holder_kernelIfEv6HolderIT_EPKS2_PKS1_S0_IS5_E", "wrrw"},
    // k_subst_chain(float const*, float const*, float*, float*, int const*,
    //   int const*, int*, int*)
    {"_Z13k_subst_chainPKfS0_PfS1_PKiS3_PiS4_", "rrwwrrww"},
    // variadic_cptr<...>(int, float const*, int const*)
    {"_Z13variadic_cptrIJfiEEviDpPKT_", "nrr"},
    // functor_kernel<...>(Doubler, float const*, float*)
    {"_Z14functor_kernelI7DoublerEvT_PKfPf", "wrw"},
    // ptr_to_const_ptr<...>(float* const*, float const* const*, float**)
    {"_Z16ptr_to_const_ptrIfEvPKPT_PKPKS0_PS1_", "rrw"},
    // k_const_struct_ptr(Params const*, Params const*, Params*, Params,
    //   Params)
    {"_Z18k_const_struct_ptrPK6ParamsS1_PS_S_S_", "rrwww"},
    // k_vec(float4, float4 const*, float4*, int2, int4 const*)
    {"_Z5k_vec6float4PKS_PS_4int2PK4int4", "wrwwr"},
    // scale<...>(Params*, Params, int)
    {"_Z5scaleI6ParamsEvPT_S1_i", "wwn"},
    // scale<...>(float const*, float const, int)
    {"_Z5scaleIKfEvPT_S1_i", "rnn"},
    // scale<...>(float**, float*, int)
    {"_Z5scaleIPfEvPT_S1_i", "wwn"},
    // scale<...>(double*, double, int)
    {"_Z5scaleIdEvPT_S0_i", "wnn"},
    // scale<...>(float*, float, int)
    {"_Z5scaleIfEvPT_S0_i", "wnn"},
    // sized<...>(float (*) [8u], float const*)
    {"_Z5sizedIfLj8EEvPAT0__T_PKS0_", "wr"},
    // tiled<...>(float const*, float*, float)
    {"_Z5tiledIfLi128ELb1EEvPKT_PS0_S0_", "rwn"},
    // tiled<...>(int const*, int*, int)
    {"_Z5tiledIiLin32ELb0EEvPKT_PS0_S0_", "rwn"},
    // axpy_t<...>(float, __half const*, __half*, float const*, int)
    {"_Z6axpy_tI6__halffEvT0_PKT_PS2_PKS1_i", "nrwrn"},
    // axpy_t<...>(double, float const*, float*, double const*, int)
    {"_Z6axpy_tIfdEvT0_PKT_PS1_PKS0_i", "nrwrn"},
    // k_enum(Mode, Plain, Mode const*)
    {"_Z6k_enum4Mode5PlainPKS_", "wwr"},
    // k_half(__half, __half const*, __half*, __nv_bfloat16, __nv_bfloat16
    //   const*, __half2*)
    {"_Z6k_half6__halfPKS_PS_13__nv_bfloat16PKS3_P7__half2", "wrwwrw"},
    // k_void()
    {"_Z6k_voidv", ""},
    // k_fnptr(void (*)(float*), float (*)(float const*, int), int)
    {"_Z7k_fnptrPFvPfEPFfPKfiEi", "wwn"},
    // k_arrptr(float (*) [16], float const (*) [16], int)
    {"_Z8k_arrptrPA16_fPA16_Kfi", "wwn"},
    // k_intptr(unsigned long, unsigned long, long, unsigned int)
    {"_Z8k_intptrmmlj", "nnnn"},
    // k_ptrptr(float**, float* const*, float const* const*, float const**,
    //   int)
    {"_Z8k_ptrptrPPfPKS_PKPKfPS4_i", "wrrwn"},
    // k_struct(Params, Small, Params const*, Params*)
    {"_Z8k_struct6Params5SmallPKS_PS_", "wwrw"},
    // long_lit<...>(unsigned long long const*, unsigned long long*,
    //   unsigned long long)
    {"_Z8long_litIyEvPKT_PS0_y", "rwn"},
    // variadic<...>()
    {"_Z8variadicIJEEvDpT_", ""},
    // variadic<...>(float*, float const*, int, Params)
    {"_Z8variadicIJPfPKfi6ParamsEEvDpT_", "wrnw"},
    // dependent<...>(Traits<float>::type const*, Traits<float>::type*)
    {"_Z9dependentIfEvPKN6TraitsIT_E4typeEPS3_", "rw"},
    // k_voidptr(void*, void const*, void**, void const* const*)
    {"_Z9k_voidptrPvPKvPS_PKS1_", "wrwr"},
    // tmpl_tmpl<...>(Holder<float>, float const*, Holder<float>*)
    {"_Z9tmpl_tmplI6HolderfEvT_IT0_EPKS2_PS3_", "wrw"},
    // with_enum<...>(float const*, float*)
    {"_Z9with_enumIL4Mode1EfEvPKT0_PS1_", "rw"},
    // outer::inner::nested(outer::inner::Cfg const*, outer::inner::Cfg,
    //   float*)
    {"_ZN5outer5inner6nestedEPKNS0_3CfgES1_Pf", "rww"},
    // outer::inner::nested_t<...>(outer::inner::Tile<outer::inner::Tile<int>
    //   >, outer::inner::Tile<outer::inner::Tile<int> > const*,
    //   outer::inner::Tile<outer::inner::Tile<int> >*,
    //   outer::inner::Tile<int> const*, outer::inner::Tile<int>)
    {"_ZN5outer5inner8nested_tINS0_4TileIiEELi8EEEvNS2_IT_EEPKS5_PS5_PKS4_S4"
     "_",
     "wrwrw"},
    // outer::inner::nested_t<...>(outer::inner::Tile<float>,
    //   outer::inner::Tile<float> const*, outer::inner::Tile<float>*, float
    //   const*, float)
    {"_ZN5outer5inner8nested_tIfLi4EEEvNS0_4TileIT_EEPKS4_PS4_PKS3_S3_", "wrwrn"},
    // (anonymous namespace)::anon_t<...>(float const*, float*, (anonymous
    //   namespace)::AnonS)
    {"_ZN36_GLOBAL__N__c2636587_4_k_cu_1384cfcb6anon_tIfEEvPKT_PS1_NS_5AnonS"
     "E",
     "rww"},
    // (anonymous namespace)::anon_kernel(float const*, float*)
    {"_ZN36_GLOBAL__N__c2636587_4_k_cu_1384cfcb11anon_kernelEPKfPf", "rw"},
};

// nvcc 13.0 of CUB and Thrust calls (cub::DeviceReduce::Sum,
// cub::DeviceScan::InclusiveSum, cub::DeviceRadixSort::SortKeys,
// thrust::transform with a __device__ lambda and with thrust::plus), a
// kernel taking cuda::std::array/tuple and one templated on a lambda.
constexpr NameCase kCubThrustKernels[] = {
    // lam_kernel<...>(lam(float*, float)::{lambda(float)#2}, float*)
    {"_Z10lam_kernelIZ3lamPffEUlfE0_EvT_S0_", "ww"},
    // lam_kernel<...>(lam(float*, float)::{lambda(float)#1}, float*)
    {"_Z10lam_kernelIZ3lamPffEUlfE_EvT_S0_", "ww"},
    // stdarr(cuda::std::array<float*, 4ul>, cuda::std::tuple<float const*,
    //   int>)
    {"_Z6stdarrN4cuda3std3__45arrayIPfLm4EEENS1_5tupleIJPKfiEEE", "ww"},
    // cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<...>(int*,
    //   int*, unsigned int*, unsigned int const*, float*, float const*,
    //   cub::NullType*, cub::NullType const*, int, int, int,
    //   cub::detail::identity_decomposer_t)
    {"_ZN3cub17CUB_300001_SM_9006detail10radix_sort29DeviceRadixSortOnesweep"
     "KernelINS1_5radix10policy_hubIfNS0_8NullTypeEjE10Policy1000ELNS0_9Sort"
     "OrderE0EfS6_jiiNS1_21identity_decomposer_tEEEvPT5_SC_PT3_PKSD_PT1_PKSH"
     "_PT2_PKSL_T4_iiT6_",
     "wwwrwrwrnnnw"},
    // cub::detail::radix_sort::DeviceRadixSortHistogramKernel<...>(unsigned
    //   int*, float const*, unsigned int, int, int,
    //   cub::detail::identity_decomposer_t)
    {"_ZN3cub17CUB_300001_SM_9006detail10radix_sort30DeviceRadixSortHistogra"
     "mKernelINS1_5radix10policy_hubIfNS0_8NullTypeEjE10Policy1000ELNS0_9Sor"
     "tOrderE0EfjNS1_21identity_decomposer_tEEEvPT2_PKT1_SB_iiT3_",
     "wrnnnw"},
    // cub::detail::radix_sort::DeviceRadixSortSingleTileKernel<...>(float
    //   const*, float*, cub::NullType const*, cub::NullType*, unsigned int,
    //   int, int, cub::detail::identity_decomposer_t)
    {"_ZN3cub17CUB_300001_SM_9006detail10radix_sort31DeviceRadixSortSingleTi"
     "leKernelINS1_5radix10policy_hubIfNS0_8NullTypeEjE10Policy1000ELNS0_9So"
     "rtOrderE0EfS6_jNS1_21identity_decomposer_tEEEvPKT1_PSB_PKT2_PSF_T3_iiT"
     "4_",
     "rwrwnnnw"},
    // cub::detail::radix_sort::DeviceRadixSortExclusiveSumKernel<...>(unsigned
    //   int*)
    {"_ZN3cub17CUB_300001_SM_9006detail10radix_sort33DeviceRadixSortExclusiv"
     "eSumKernelINS1_5radix10policy_hubIfNS0_8NullTypeEjE10Policy1000EjEEvPT"
     "0_",
     "w"},
    // cub::detail::EmptyKernel<...>()
    {"_ZN3cub17CUB_300001_SM_9006detail11EmptyKernelIvEEvv", ""},
    // cub::detail::scan::DeviceScanKernel<...>(int const*, int*,
    //   cub::ScanTileState<int, true>, int, cuda::std::plus<void>,
    //   cub::NullType, unsigned int)
    {"_ZN3cub17CUB_300001_SM_9006detail4scan16DeviceScanKernelINS2_10policy_"
     "hubIiiijN4cuda3std3__44plusIvEEE10Policy1000EPKiPiNS0_13ScanTileStateI"
     "iLb1EEES9_NS0_8NullTypeEjiLb0ESH_EEvT0_T1_T2_iT3_T4_T5_",
     "rwwnwwn"},
    // cub::detail::scan::DeviceScanInitKernel<...>(cub::ScanTileState<int,
    //   true>, int)
    {"_ZN3cub17CUB_300001_SM_9006detail4scan20DeviceScanInitKernelINS0_13Sca"
     "nTileStateIiLb1EEEEEvT_i",
     "wn"},
    // cub::detail::reduce::DeviceReduceKernel<...>(float const*, float*,
    //   unsigned int, cub::GridEvenShare<unsigned int>,
    //   cuda::std::plus<void>, cuda::std::__identity)
    {"_ZN3cub17CUB_300001_SM_9006detail6reduce18DeviceReduceKernelINS2_10pol"
     "icy_hubIfjN4cuda3std3__44plusIvEEE10Policy1000EPKfjS9_fNS7_10__identit"
     "yEEEvT0_PT3_T1_NS0_13GridEvenShareISI_EET2_T4_",
     "rwnwww"},
    // cub::detail::reduce::DeviceReduceSingleTileKernel<...>(float const*,
    //   float*, unsigned int, cuda::std::plus<void>, float,
    //   cuda::std::__identity)
    {"_ZN3cub17CUB_300001_SM_9006detail6reduce28DeviceReduceSingleTileKernel"
     "INS2_10policy_hubIfjN4cuda3std3__44plusIvEEE10Policy1000EPKfPfjS9_ffNS"
     "7_10__identityEEEvT0_T1_T2_T3_T4_T6_",
     "rwnwnw"},
    // cub::detail::reduce::DeviceReduceSingleTileKernel<...>(float*,
    //   float*, int, cuda::std::plus<void>, float, cuda::std::__identity)
    {"_ZN3cub17CUB_300001_SM_9006detail6reduce28DeviceReduceSingleTileKernel"
     "INS2_10policy_hubIfjN4cuda3std3__44plusIvEEE10Policy1000EPfSC_iS9_ffNS"
     "7_10__identityEEEvT0_T1_T2_T3_T4_T6_",
     "wwnwnw"},
    // cub::detail::transform::transform_kernel<...>(int, int,
    //   cuda::std::plus<float>,
    //   thrust::detail::normal_iterator<thrust::device_ptr<float> >,
    //   cub::detail::transform::kernel_arg<float*>,
    //   cub::detail::transform::kernel_arg<float*>)
    {"_ZN3cub17CUB_300001_SM_9006detail9transform16transform_kernelINS2_10po"
     "licy_hubILb0EN4cuda3std3__45tupleIJN6thrust23THRUST_300001_SM_900_NS6d"
     "etail15normal_iteratorINSA_10device_ptrIfEEEESF_EEEE10policy1000EiNS7_"
     "4plusIfEESF_JPfSL_EEEvT0_iT1_T2_DpNS2_10kernel_argIT3_EE",
     "nnwwww"},
    // cub::detail::transform::transform_kernel<...>(long, int,
    //   cuda::std::plus<float>,
    //   thrust::detail::normal_iterator<thrust::device_ptr<float> >,
    //   cub::detail::transform::kernel_arg<float*>,
    //   cub::detail::transform::kernel_arg<float*>)
    {"_ZN3cub17CUB_300001_SM_9006detail9transform16transform_kernelINS2_10po"
     "licy_hubILb0EN4cuda3std3__45tupleIJN6thrust23THRUST_300001_SM_900_NS6d"
     "etail15normal_iteratorINSA_10device_ptrIfEEEESF_EEEE10policy1000ElNS7_"
     "4plusIfEESF_JPfSL_EEEvT0_iT1_T2_DpNS2_10kernel_argIT3_EE",
     "nnwwww"},
    // cub::detail::transform::transform_kernel<...>(int, int,
    //   thr(thrust::device_vector<float, thrust::device_allocator<float>
    //   >&, thrust::device_vector<float, thrust::device_allocator<float>
    //   >&)::{lambda(float)#1},
    //   thrust::detail::normal_iterator<thrust::device_ptr<float> >,
    //   cub::detail::transform::kernel_arg<float*>)
    {"_ZN3cub17CUB_300001_SM_9006detail9transform16transform_kernelINS2_10po"
     "licy_hubILb1EN4cuda3std3__45tupleIJN6thrust23THRUST_300001_SM_900_NS6d"
     "etail15normal_iteratorINSA_10device_ptrIfEEEEEEEE10policy1000EiZ3thrRN"
     "SA_13device_vectorIfNSA_16device_allocatorIfEEEESN_EUlfE_SF_JPfEEEvT0_"
     "iT1_T2_DpNS2_10kernel_argIT3_EE",
     "nnwww"},
    // cub::detail::transform::transform_kernel<...>(long, int,
    //   thr(thrust::device_vector<float, thrust::device_allocator<float>
    //   >&, thrust::device_vector<float, thrust::device_allocator<float>
    //   >&)::{lambda(float)#1},
    //   thrust::detail::normal_iterator<thrust::device_ptr<float> >,
    //   cub::detail::transform::kernel_arg<float*>)
    {"_ZN3cub17CUB_300001_SM_9006detail9transform16transform_kernelINS2_10po"
     "licy_hubILb1EN4cuda3std3__45tupleIJN6thrust23THRUST_300001_SM_900_NS6d"
     "etail15normal_iteratorINSA_10device_ptrIfEEEEEEEE10policy1000ElZ3thrRN"
     "SA_13device_vectorIfNSA_16device_allocatorIfEEEESN_EUlfE_SF_JPfEEEvT0_"
     "iT1_T2_DpNS2_10kernel_argIT3_EE",
     "nnwww"},
};

// nvcc 13.0 (--extended-lambda) of kernels written the way PyTorch writes
// them: at::native namespaces, an anonymous namespace, TensorInfo and
// OffsetCalculator structs by value, __grid_constant__, kernels templated
// on a lambda defined in a function template, packs in the middle of the
// parameter list, a static kernel.
constexpr NameCase kPyTorchStyleKernels[] = {
    // const_T_ptr<...>(int* const*, int**, int* const* const*)
    {"_Z11const_T_ptrIPiEvPKT_PS1_PKS3_", "rwr"},
    // pack_middle<...>(int, float const*, int const*, double*, float*)
    {"_Z11pack_middleIfJPKiPdEEviPKT_DpT0_Pf", "nrrww"},
    // static_kernel(int const*, int*)
    {"_Z13static_kernelPKiPi", "rw"},
    // pack_two<...>(float*, int*, float const*, int const*)
    {"_Z8pack_twoIJfiEEvDpPT_DpPKS0_", "wwrr"},
    // at::native::grid_const(at::native::OffsetCalculator<3>, float*)
    {"_ZN2at6native10grid_constENS0_16OffsetCalculatorILi3EEEPf", "ww"},
    // at::native::index_copy<...>(at::cuda::detail::TensorInfo<float,
    //   unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned
    //   int>, long const*, unsigned int)
    {"_ZN2at6native10index_copyIfjLin1EEEvNS_4cuda6detail10TensorInfoIT_T0_E"
     "ENS4_IKS5_S6_EEPKlS6_",
     "wwrn"},
    // at::native::reduce_kernel<...>(at::native::OffsetCalculator<2>,
    //   double const* const*, double**, c10::complex<double>)
    {"_ZN2at6native13reduce_kernelIdEEvNS0_16OffsetCalculatorILi2EEEPKPKT_PP"
     "S4_N3c107complexIS4_EE",
     "wrww"},
    // at::native::elementwise_kernel<...>(int,
    //   at::native::launch_add<double>(double)::{lambda(int)#1})
    {"_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_10launch_addIdEEvT_EU"
     "liE_EEviT1_",
     "nw"},
    // at::native::elementwise_kernel<...>(int,
    //   at::native::launch_add<float>(float)::{lambda(int)#1})
    {"_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_10launch_addIfEEvT_EU"
     "liE_EEviT1_",
     "nw"},
    // at::native::(anonymous namespace)::softmax_forward<...>(c10::Half*,
    //   c10::Half const*, long, float)
    {"_ZN2at6native37_GLOBAL__N__5629fdc9_5_pt_cu_af286b9215softmax_forwardI"
     "N3c104HalfEflEEvPT_PKS5_T1_T0_",
     "wrnn"},
    // at::native::(anonymous namespace)::softmax_forward<...>(float*, float
    //   const*, int, float)
    {"_ZN2at6native37_GLOBAL__N__5629fdc9_5_pt_cu_af286b9215softmax_forwardI"
     "ffiEEvPT_PKS3_T1_T0_",
     "wrnn"},
};

// Kernel names shipped in the CUDA 13.0 libraries (strings of
// libcublas.so.13, libcublasLt.so.13, libcusparse.so, libcudnn_ops.so.9,
// libcurand.so.10): production cuBLAS, cuSPARSE, cuDNN and cuRAND kernels.
constexpr NameCase kCudaLibraryKernels[] = {
    // dot_kernel<...>(cublasDotParams<cublasGemvTensor<float2 const>,
    //   cublasGemvTensorStridedBatched<float2> >)
    {"_Z10dot_kernelI6float2Li128ELi0E15cublasDotParamsI16cublasGemvTensorIK"
     "S0_E30cublasGemvTensorStridedBatchedIS0_EEEvT2_",
     "w"},
    // batch_gemm_kernel1x1_core<...>(__half* const*, __half const* const*,
    //   __half const* const*, __half*, __half const*, __half const*, int,
    //   int, int, int, int, int, long long, long long, long long, __half
    //   const*, __half const*, __half, __half, int, int)
    {"_Z25batch_gemm_kernel1x1_coreI6__halfS0_S0_Lb1ELb0ELb0ELb1ELb1ELb1ELb0"
     "EEvPKPT0_PKPKT_S9_S2_S7_S7_iiiiiixxxPKT1_SC_SA_SA_ii",
     "rrrwrrnnnnnnnnnrrwwnn"},
    // cgemm_largek<...>(float2*, float2 const*, float2 const*, int, int,
    //   int, int, int, int, float2 const*, float2 const*, float2, float2,
    //   int, int, int*, int*)
    {"_Z12cgemm_largekILb0ELb0ELb0ELb0ELi4ELi4ELi4ELi3ELi3ELi16EEvP6float2PK"
     "S0_S3_iiiiiiS3_S3_S0_S0_iiPiS4_",
     "wrrnnnnnnrrwwnnww"},
    // trsm_batch_right_lower_kernel_small<...>(cublasTrsmBatchParams<double>,
    //   double const* const*, double* const*, double const*, double)
    {"_Z35trsm_batch_right_lower_kernel_smallIdLi1ELi1ELi64EEv21cublasTrsmBa"
     "tchParamsIT_EPKPKS1_PKPS1_S4_S1_",
     "wrrrn"},
    // cublasLt_imma_emu::cutlass_unfused_epilogue_ker<...>(cudaDataType_t,
    //   unsigned int, unsigned int, int const*, unsigned int, long, int
    //   const*, long, int const*, long, int, int*, int, unsigned int)
    {"_ZN17cublasLt_imma_emu28cutlass_unfused_epilogue_kerILi16ELi16EEEv14cu"
     "daDataType_tjjPKijlS3_lS3_liPiij",
     "wnnrnnrnrnnwnn"},
    // cublasLt::splitKreduce_kernel<...>(cublasLt::cublasSplitKParams<float2>,
    //   float2 const*, float2 const*, float2*, float2*, float2 const*,
    //   float2 const*, float2 const*, float2 const*, float2*, void*, long,
    //   float2*, int*, float2*, float2*, float2 const*, float2 const*,
    //   float2 const*, float2 const*, float2 const*)
    {"_ZN8cublasLt19splitKreduce_kernelILi8ELi32Ei6float2S1_S1_S1_Lb0ES1_S1_"
     "S1_Lb0ELb0ELb0ELb0EEEvNS_18cublasSplitKParamsIT4_EEPKT2_PKT8_PT7_PT3_P"
     "KS3_SG_PKT9_S7_PSH_PvlPS3_PiSM_SM_SG_SG_SG_SG_SG_",
     "wrrwwrrrrwwnwwwwrrrrr"},
    // cusparse::coomm_alg3_kernel<...>(int, int,
    //   cusparse::KernelCoeffs<double>, int, int, int const*, int const*,
    //   double const*, long, double const*, int, long, double*, int, long)
    {"_ZN8cusparse17coomm_alg3_kernelILb1ELb1ELb1EiiddddEEvT2_S1_NS_12Kernel"
     "CoeffsIT7_EEiiPKT3_S7_PKT4_lPKT5_S1_lPT6_S1_l",
     "nnwnnrrrnrnnwnn"},
    // crCopyMemoryGlobal_multiple<...>(float2*, int, float2 const*, int,
    //   int, int, int)
    {"_Z27crCopyMemoryGlobal_multipleI6float2EvPT_iPKS1_iiii", "wnrnnnn"},
    // cudnn::ops::softmax_fw_kernel_resident<...>(cudnnTensorStruct, __half
    //   const*, cudnnTensorStruct, __half*, int, float, float, int, int)
    {"_ZN5cudnn3ops26softmax_fw_kernel_residentILi2E6__halffLi256ELi0ELi0ELi"
     "0ELi128ELi96EEEv17cudnnTensorStructPKS2_S3_PS2_iT1_S7_ii",
     "wrwwnnnnn"},
    // softmax_fw_small_kernel<...>(__nv_bfloat16*, __nv_bfloat16 const*,
    //   int, int, int, float, float)
    {"_Z23softmax_fw_small_kernelI13__nv_bfloat16fLi2ELi1ELi8ELi1EEvPT_PKS1_"
     "iiiT0_S5_",
     "wrnnnnn"},
    // gen_sequenced<...>(curandStateTest*, double*, unsigned long, unsigned
    //   long, int)
    {"_Z13gen_sequencedI15curandStateTestdiXadL_Z28curand_uniform_double_noa"
     "rgsIS0_EdPT_iEEEvS3_PT0_mmT1_",
     "wwnnn"},
    // gen_quasi<...>(unsigned int*, unsigned long, unsigned int, unsigned
    //   int, unsigned long long, __curandStateSharedSobol<unsigned long
    //   long>::value_type const*, double)
    {"_Z9gen_quasiI24__curandStateSharedSobolIyEjdXadL_Z35internal__curand_p"
     "oisson_ITR_doubleIyEjT_dEE20qrng_config_overrideI10rng_configIS1_L14cu"
     "randOrdering101EELi32768ELi128EEEvPT0_mjjyPKNS3_10value_typeET1_",
     "wnnnnrn"},
};

// g++ 12 names: the host twins of kernels the fake driver runs (an
// anonymous namespace is _GLOBAL__N_1 there, internal linkage adds `L`, a
// clone adds a suffix) and corner cases of the substitution rules.
constexpr NameCase kGxxNames[] = {
    // clone_me(float const*, float*, int) [clone .constprop.0]
    {"_ZL8clone_mePKfPfi.constprop.0", "rwn"},
    // (anonymous namespace)::anon_kernel(float const*, float*, int)
    {"_ZN12_GLOBAL__N_111anon_kernelEPKfPfi", "rwn"},
    // (anonymous namespace)::anon_struct((anonymous namespace)::S,
    //   (anonymous namespace)::S const*)
    {"_ZN12_GLOBAL__N_111anon_structENS_1SEPKS0_", "wr"},
    // a(float const volatile*, float const volatile*, float*, float const*)
    {"_Z1aPVKfS0_PfPKf", "rrwr"},
    // b<...>(float* const*)
    {"_Z1bIKPfEvPT_", "r"},
    // b<...>(float const volatile*)
    {"_Z1bIVKfEvPT_", "r"},
    // c(float const* restrict*, float* const*)
    {"_Z1cPrPKfPKPf", "wr"},
    // d(float const (*) [4], int (*)(int const*))
    {"_Z1dPA4_KfPFiPKiE", "ww"},
    // f<...>(S::{unnamed type#1}, S::{unnamed type#1}*, S)
    {"_Z1fIN1SUt_EEvT_PS2_S0_", "www"},
    // g<S::{unnamed type#1}, int>(S::{unnamed type#1}, int*, int); the
    // demangler of libstdc++ adds `Ut_` to the table twice and prints the
    // last parameter as S::{unnamed type#1}.
    {"_Z1gIN1SUt_EiEvT_PT0_S3_", "wwn"},
    // h<...>(use()::Loc*, use()::Loc const*)
    {"_Z1hIZ3usevE3LocEvPT_PKS1_", "wr"},
    // h<...>(use()::{lambda(int)#1}*, use()::{lambda(int)#1} const*)
    {"_Z1hIZ3usevEUliE_EvPT_PKS1_", "wr"},
    // n::k<...>(n::u()::{lambda(float*)#1}, float*, float const*)
    {"_ZN1n1kIZNS_1uEvEUlPfE_EEvT_S1_PKf", "wwr"},
    // h(_Float16, _Float16 const*, char8_t, char8_t const*, __float128,
    //   _Complex float, decltype(nullptr)); g++ 12's runtime demangler does
    //   not know DF16_, so the parse stands alone here.
    {"_Z1hDF16_PKDF16_DuPKDugCfDn", "nrnrnwn"},
    // v(float __vector(4), float __vector(4) const*, float __vector(4)*)
    {"_Z1vDv4_fPKS_PS_", "wrw"},
    // mp(int A::*, void (A::*)(), int const*)
    {"_Z2mpM1AiMS_FvvEPKi", "wwr"},
    // pk<>()
    {"_Z2pkIJEEvDpT_", ""},
};

TEST(KernelSignatureTest, MlpExampleKernels) {
  for (const NameCase& c : kMlpExample) ExpectSignature(c);
}

TEST(KernelSignatureTest, NvccKernels) {
  for (const NameCase& c : kNvccKernels) ExpectSignature(c);
}

TEST(KernelSignatureTest, CubThrustKernels) {
  for (const NameCase& c : kCubThrustKernels) ExpectSignature(c);
}

TEST(KernelSignatureTest, PyTorchStyleKernels) {
  for (const NameCase& c : kPyTorchStyleKernels) ExpectSignature(c);
}

TEST(KernelSignatureTest, CudaLibraryKernels) {
  for (const NameCase& c : kCudaLibraryKernels) ExpectSignature(c);
}

TEST(KernelSignatureTest, GxxNames) {
  for (const NameCase& c : kGxxNames) ExpectSignature(c);
}

// The SGD step writes the weights and the velocity and reads the gradient:
// S0_ is `float*` (the first candidate after the namespace).
TEST(KernelSignatureTest, SgdMomentumWritesWeightsAndVelocity) {
  const KernelSignature signature = ParseKernelSignature("_ZN3mlp12sgd_momentumEPfS0_PKfffi");
  ASSERT_TRUE(signature.parsed);
  EXPECT_EQ(signature.demangled_name,
            "mlp::sgd_momentum(float*, float*, float const*, float, float, "
            "int)");
  EXPECT_EQ(signature.params,
            (std::vector<ParamAccess>{kReadWrite, kReadWrite, kRead, kNone, kNone, kNone}));
}

// The table of _ZN3mlp14linear_forwardEPKfS1_S1_Pfiii is {mlp, const float,
// const float*}: both S1_ are `const float*`, reads.
TEST(KernelSignatureTest, SubstitutionKeepsConstness) {
  const KernelSignature signature = ParseKernelSignature("_ZN3mlp14linear_forwardEPKfS1_S1_Pfiii");
  ASSERT_TRUE(signature.parsed);
  EXPECT_EQ(Letters(signature.params), "rrrwnnn");
}

// cutlass::Kernel<...>(Op::Params, int const*, int) from libcublasLt.so.13:
// the libstdc++ demangler gives up on it (its component budget is twice the
// name's length); the structural parse alone answers.
TEST(KernelSignatureTest, NameTheRuntimeDemanglerRejects) {
  constexpr char kName[] =
      "_ZN7cutlass6KernelINS_4gemm6kernel11GemmBatchedINS1_11threadblock12M"
      "maPipelinedINS1_9GemmShapeILi32ELi32ELi8EEENS_9transform11threadbloc"
      "k22PredicatedTileIteratorINS_11MatrixShapeILi32ELi8EEEiNS_6layout8Ro"
      "wMajorELi1ENS8_30PitchLinearStripminedThreadMapINS_16PitchLinearShap"
      "eILi8ELi32EEELi128ELi1EEELi1ELb0EEENS9_19RegularTileIteratorISC_iNSD"
      "_11ColumnMajorELi1ENS8_33TransposePitchLinearThreadMapSimtISI_EELi4E"
      "EENSA_INSB_ILi8ELi32EEEiSE_Li0ENSF_INSG_ILi32ELi8EEELi128ELi1EEELi1E"
      "Lb0EEENSK_ISP_iSE_Li0ESR_Li4EEEiSE_NS4_9MmaPolicyINS1_4warp7MmaSimtI"
      "NS6_ILi16ELi16ELi8EEEiSL_iSE_iSE_NSV_13MmaSimtPolicyINSB_ILi4ELi8EEE"
      "NSD_19RowMajorInterleavedILi1EEENS6_ILi4ELi2ELi1EEEEELi1ELNS_16Compl"
      "exTransformE0ELS14_0ENS_4arch5OpEscEbEENSB_ILi4ELi0EEENSB_ILi0ELi0EE"
      "ELi1EEENS_21NumericArrayConverterIiiLi2ELNS_15FloatRoundStyleE2ENS8_"
      "6thread14UnaryTransform8IdentityEEES1G_bEENS_8epilogue11threadblock8"
      "EpilogueIS7_S17_Li1ENS1J_22PredicatedTileIteratorINS1J_26OutputTileO"
      "ptimalThreadMapINS1J_15OutputTileShapeILi32ELi1ELi4ELi2ELi1EEENS1N_I"
      "Li1ELi4ELi1ELi1ELi4EEELi128ELi1ELi32EEEiLb0ENSD_9NoPermuteELb0EEENS1"
      "I_4warp20FragmentIteratorSimtISX_NS1_6thread3MmaIS12_iSL_iSE_iSE_S16"
      "_bEESE_S13_EENS1T_16TileIteratorSimtISX_S1X_iSE_S13_EENS1J_18SharedL"
      "oadIteratorINS1Q_18CompactedThreadMapEiLi4EEENS1I_6thread21LinearCom"
      "binationReluIiLi1EiiLNS24_9ScaleType4KindE0ELS1C_2EEENSB_ILi0ELi9EEE"
      "Li1ELi1EEENS4_37GemmBatchedIdentityThreadblockSwizzleEEEEEvNT_6Param"
      "sEPKii";
  const KernelSignature signature = ParseKernelSignature(kName);
  ASSERT_TRUE(signature.parsed);
  EXPECT_EQ(Letters(signature.params), "wrn");
}

// Past 2 KiB the runtime demangler is not asked (its stack use grows with
// the name); the structural parse still answers.
TEST(KernelSignatureTest, VeryLongNameSkipsTheDemangler) {
  std::string name = "_Z1kI";
  while (name.size() < 3000) name += "Li1E";
  name += "EvPKfPf";
  const KernelSignature signature = ParseKernelSignature(name);
  ASSERT_TRUE(signature.parsed);
  EXPECT_EQ(Letters(signature.params), "rw");
  EXPECT_EQ(signature.demangled_name, name);
}

TEST(KernelSignatureTest, ExternCKernelsAreReadWrite) {
  // nvcc names extern "C" kernels plainly.
  for (const char* name : {"c_kernel", "c_kernel2", "f", "Pf", "_kernel"}) {
    SCOPED_TRACE(name);
    const KernelSignature signature = ParseKernelSignature(name);
    EXPECT_FALSE(signature.parsed);
    EXPECT_TRUE(signature.params.empty());
    // Not demangled as a type ("f" would be "float").
    EXPECT_EQ(signature.demangled_name, name);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(signature.For(i), kReadWrite);
  }
}

TEST(KernelSignatureTest, NamesThatAreNotKernelSignatures) {
  for (const char* name : {
           "",
           "_",
           "_Z",
           "_Z3foo",                                 // data, not a function
           "_ZSt7nothrow",                           // data in std
           "_ZN6cublas8internal15deviceConstantsE",  // data (libcublas)
           "_ZTV3Foo",                               // vtable
           "_ZTI3Foo",                               // typeinfo
           "_ZGVZ1fvE1x",                            // guard variable
           // void f(const char*, cudnnStatus_t, bool, const char*, ...)
           "_Z20traceback_iretf_implPKc13cudnnStatus_tbS0_z",
           "_Z1fvi",                     // void among parameters
           "_Z1fPfX",                    // trailing garbage
           "_Z1fS_",                     // substitution before any candidate
           "_Z1fIiEvT0_",                // template parameter out of range
           "_Z1fDpT_",                   // pack expansion outside a template
           "_Z1fIiEvDpT_",               // expands no pack
           "_Z1fIJiEJfiEEvDpT_T0_",      // T0_ is a pack, used unexpanded
           "_Z1fIJiEJfiEEvDpPFvT_T0_E",  // packs of different lengths
           "_Z1fDB8_",                   // _BitInt: not modelled
           "_Z3fooILi1EEvPKfPf\n",
       }) {
    SCOPED_TRACE(name);
    const KernelSignature signature = ParseKernelSignature(name);
    EXPECT_FALSE(signature.parsed);
    EXPECT_TRUE(signature.params.empty());
    EXPECT_EQ(signature.For(0), kReadWrite);
  }
}

TEST(KernelSignatureTest, EmbeddedNulIsNotParsed) {
  const std::string name("_ZN3mlp11init_paramsEPfijf\0x", 29);
  const KernelSignature signature = ParseKernelSignature(name);
  EXPECT_FALSE(signature.parsed);
  EXPECT_EQ(signature.For(0), kReadWrite);
}

TEST(KernelSignatureTest, ForIsConservative) {
  KernelSignature signature;
  signature.params = {kNone, kRead};
  // Not parsed: every index is read-write, whatever params holds.
  EXPECT_EQ(signature.For(0), kReadWrite);
  EXPECT_EQ(signature.For(1), kReadWrite);
  signature.parsed = true;
  EXPECT_EQ(signature.For(0), kNone);
  EXPECT_EQ(signature.For(1), kRead);
  EXPECT_EQ(signature.For(2), kReadWrite);
  EXPECT_EQ(signature.For(SIZE_MAX), kReadWrite);
}

TEST(KernelSignatureTest, ParamAccessNames) {
  EXPECT_STREQ(ParamAccessName(kNone), "none");
  EXPECT_STREQ(ParamAccessName(kRead), "read");
  EXPECT_STREQ(ParamAccessName(kReadWrite), "read-write");
}

TEST(DemangledParamsAgreeTest, CountsParametersAtTopLevelOnly) {
  EXPECT_TRUE(DemangledParamsAgree("f(float const*, float*, int)", {kRead, kReadWrite, kNone}));
  EXPECT_TRUE(
      DemangledParamsAgree("void g<Foo<int, float> >(Foo<int, float>, void (*)(float*, int), "
                           "{lambda(int, int)#1}, float (*) [(4)*(2)])",
                           {kReadWrite, kReadWrite, kReadWrite, kReadWrite}));
  EXPECT_TRUE(DemangledParamsAgree("(anonymous namespace)::f(int, (anonymous namespace)::S const*)",
                                   {kNone, kRead}));
  EXPECT_TRUE(DemangledParamsAgree("void k<>()", {}));
  EXPECT_TRUE(DemangledParamsAgree("f(int) [clone .constprop.0]", {kNone}));
  EXPECT_TRUE(DemangledParamsAgree("S::f(int) const &", {kNone}));
  EXPECT_FALSE(DemangledParamsAgree("f(int, int)", {kNone}));
  EXPECT_FALSE(DemangledParamsAgree("f(int)", {kNone, kNone}));
  EXPECT_FALSE(DemangledParamsAgree("f(Foo<int, int)", {kReadWrite}));
  EXPECT_FALSE(DemangledParamsAgree("std::nothrow", {}));
}

TEST(DemangledParamsAgreeTest, ReadNeedsAPrintedPointerToConst) {
  EXPECT_TRUE(DemangledParamsAgree("f(float const*)", {kRead}));
  EXPECT_TRUE(DemangledParamsAgree("f(float* const*)", {kRead}));
  EXPECT_TRUE(DemangledParamsAgree("f(float const volatile*)", {kRead}));
  EXPECT_FALSE(DemangledParamsAgree("f(float*)", {kRead}));
  EXPECT_FALSE(DemangledParamsAgree("f(float const)", {kRead}));
  EXPECT_FALSE(DemangledParamsAgree("f(float const* restrict*)", {kRead}));
  EXPECT_FALSE(DemangledParamsAgree("f(myconst*)", {kRead}));
  EXPECT_FALSE(DemangledParamsAgree("f(float const&)", {kRead}));
  // A scalar is never printed with * or &.
  EXPECT_TRUE(DemangledParamsAgree("f(unsigned long, decltype(nullptr))", {kNone, kNone}));
  EXPECT_FALSE(DemangledParamsAgree("f(float*)", {kNone}));
  EXPECT_FALSE(DemangledParamsAgree("f(int&)", {kNone}));
  // Read-write needs no confirmation.
  EXPECT_TRUE(DemangledParamsAgree("f(float const*, int)", {kReadWrite, kReadWrite}));
}

std::vector<std::string> AllTableNames() {
  std::vector<std::string> names;
  for (const NameCase& c : kMlpExample) names.push_back(c.mangled);
  for (const NameCase& c : kNvccKernels) names.push_back(c.mangled);
  for (const NameCase& c : kCubThrustKernels) names.push_back(c.mangled);
  for (const NameCase& c : kPyTorchStyleKernels) names.push_back(c.mangled);
  for (const NameCase& c : kCudaLibraryKernels) names.push_back(c.mangled);
  for (const NameCase& c : kGxxNames) names.push_back(c.mangled);
  return names;
}

// Whatever the input, the answer is well formed: parsed signatures agree
// with the structural parse and For() stays in range.
void CheckWellFormed(std::string_view name) {
  const KernelSignature signature = ParseKernelSignature(name);
  if (!signature.parsed) {
    EXPECT_TRUE(signature.params.empty());
    EXPECT_EQ(signature.For(0), kReadWrite);
    return;
  }
  const auto structural = ClassifyMangledParams(name);
  ASSERT_TRUE(structural.has_value()) << name;
  EXPECT_EQ(*structural, signature.params) << name;
  EXPECT_EQ(signature.For(signature.params.size()), kReadWrite);
}

// Random truncations, mutations and strings must never crash, hang or trip
// the sanitizers (bazel test --config=asan).
TEST(KernelSignatureRobustnessTest, TruncatedAndMutatedNames) {
  std::mt19937 rng(20240611);
  const std::string alphabet = "_ZNESIJKPRVTLXDOFAMUYCGBWpfijvcbdlmnostwxyzeghaukqr0123456789";
  for (const std::string& name : AllTableNames()) {
    for (size_t cut = 0; cut < name.size(); ++cut) {
      CheckWellFormed(std::string_view(name).substr(0, cut));
    }
    for (int round = 0; round < 40; ++round) {
      std::string mutated = name;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !mutated.empty(); ++e) {
        const size_t at = rng() % mutated.size();
        const char c = alphabet[rng() % alphabet.size()];
        switch (rng() % 3) {
          case 0:
            mutated[at] = c;
            break;
          case 1:
            mutated.erase(at, 1);
            break;
          default:
            mutated.insert(at, 1, c);
            break;
        }
      }
      CheckWellFormed(mutated);
    }
  }
}

TEST(KernelSignatureRobustnessTest, RandomStrings) {
  std::mt19937 rng(7);
  const std::string alphabet = "_ZNESIJKPRVTLXDOFAMUYCGBWpfijvcbdlmnostwxyzeghaukqr0123456789";
  for (int i = 0; i < 20000; ++i) {
    std::string name = (i % 4 == 0) ? "" : "_Z";
    const size_t length = rng() % 48;
    for (size_t j = 0; j < length; ++j) {
      // A quarter of the strings use arbitrary bytes, NUL included.
      name += (i % 4 == 1) ? static_cast<char>(rng() & 0xff) : alphabet[rng() % alphabet.size()];
    }
    CheckWellFormed(name);
  }
}

// libstdc++'s demangler (GCC 12) does not return in minutes on this
// malformed name (found by core/inference/kernel_signature_fuzz.cc); the parser
// rejects it, so the demangler is never asked and the call returns.
TEST(KernelSignatureRobustnessTest, NameThatHangsTheRuntimeDemangler) {
  const std::string name = "_Z1hKfcgnstfssssssAsssssssssrssssssssrestrKffDn";
  const KernelSignature signature = ParseKernelSignature(name);
  EXPECT_FALSE(signature.parsed);
  EXPECT_EQ(signature.demangled_name, name);
}

TEST(KernelSignatureRobustnessTest, DeepNestingIsBounded) {
  const std::string pointers = "_Z1f" + std::string(100000, 'P') + "i";
  EXPECT_FALSE(ParseKernelSignature(pointers).parsed);
  std::string templates = "_Z1f";
  for (int i = 0; i < 20000; ++i) templates += "N1AI";
  EXPECT_FALSE(ParseKernelSignature(templates).parsed);
  std::string expressions = "_Z1fIX";
  for (int i = 0; i < 50000; ++i) expressions += "pl";
  EXPECT_FALSE(ParseKernelSignature(expressions).parsed);
  std::string encodings = "_Z1fI";
  for (int i = 0; i < 20000; ++i) encodings += "XadL_Z1gI";
  EXPECT_FALSE(ParseKernelSignature(encodings).parsed);
  // Template parameters that name each other do not loop.
  EXPECT_FALSE(ParseKernelSignature("_Z1fIT_EvPT_").parsed);
  EXPECT_FALSE(ParseKernelSignature("_Z1fIT0_T_EvPT_").parsed);
  // Moderate depth still parses: 40 pointers to a const float.
  const KernelSignature nested = ParseKernelSignature("_Z1f" + std::string(40, 'P') + "Kf");
  ASSERT_TRUE(nested.parsed);
  EXPECT_EQ(Letters(nested.params), "w");
}

// Pointer tables: what a pointer-to-pointers parameter lets the kernel do
// to the targets of the table's entries.
std::string PointeeLetters(const KernelSignature& s) {
  std::string out;
  for (Pointees p : s.pointees) {
    out += p == Pointees::kNone ? '-' : p == Pointees::kConst ? 'c' : 'w';
  }
  return out;
}

TEST(KernelSignaturePointeesTest, ClassifiesPointerTables) {
  struct Case {
    const char* mangled;
    const char* pointees;
  } cases[] = {
      {"_Z1fPPf", "w"},       // float**
      {"_Z1fPKPKf", "c"},     // float const* const*
      {"_Z1fPKPf", "w"},      // float* const*: targets written
      {"_Z1fPPKf", "c"},      // float const**
      {"_Z1fPfPKfi", "---"},  // no tables
      {"_Z1fRPPf", "w"},      // a reference to a table pointer
      // A reference is one more level: the referenced `float const**`
      // points to `float const*` entries the kernel may write. (Found by
      // core/inference/kernel_signature_differential_test.cc: these were "c".)
      {"_Z1fRPPKf", "w"},   // float const**&
      {"_Z1fOPPKPo", "w"},  // unsigned __int128* const**&&
      {"_Z1fRPKPKf", "c"},  // float const* const*&: all const
      {"_Z1fRKPKf", "c"},   // float const* const&
      {"_Z1fRPf", "w"},     // float*&
      // Reference collapsing: Args&& with Args = `int const&` is one level.
      {"_Z1fIJRKiEEvDpOT_", "-"},
      {"_Z1fPPPf", "w"},               // float***
      {"_Z6kernelPPcS0_Pl", "ww-"},    // char**, char**, long*
      {"_Z6kernelPKPKvPKPvi", "cw-"},  // void const* const*, void* const*, int
      // A table of const pointers reached through a struct by value.
      {"_Z1f6Params", "-"},
  };
  for (const Case& c : cases) {
    const KernelSignature s = ParseKernelSignature(c.mangled);
    ASSERT_TRUE(s.parsed) << c.mangled;
    EXPECT_EQ(PointeeLetters(s), c.pointees) << c.mangled;
  }
}

TEST(KernelSignaturePointeesTest, UnparsedNamesClaimNothing) {
  const KernelSignature s = ParseKernelSignature("extern_c_kernel");
  EXPECT_FALSE(s.parsed);
  EXPECT_EQ(s.PointeesFor(0), Pointees::kNone);
}

TEST(KernelSignaturePointeesTest, PrintedTypesConfirmConstTargets) {
  using kernel_signature_internal::PrintedAsPointerToPointerToConst;
  EXPECT_TRUE(PrintedAsPointerToPointerToConst("float const* const*"));
  EXPECT_TRUE(PrintedAsPointerToPointerToConst("float const**"));
  EXPECT_TRUE(PrintedAsPointerToPointerToConst(" void const* const volatile* "));
  EXPECT_FALSE(PrintedAsPointerToPointerToConst("float* const*"));
  EXPECT_FALSE(PrintedAsPointerToPointerToConst("float**"));
  EXPECT_FALSE(PrintedAsPointerToPointerToConst("float const*"));
  EXPECT_TRUE(PrintedAsPointerToPointerToConst("float const* const&"));
  EXPECT_TRUE(PrintedAsPointerToPointerToConst("float const* const&&"));
  // The referenced `float const*` is the table's one entry.
  EXPECT_TRUE(PrintedAsPointerToPointerToConst("float const*&"));
  EXPECT_FALSE(PrintedAsPointerToPointerToConst("float*&"));
  EXPECT_FALSE(PrintedAsPointerToPointerToConst("float const&"));
}

}  // namespace
}  // namespace stensor
