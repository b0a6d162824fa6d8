"""Driver-API test programs linked to the fake libcuda.so.1 by path."""

def fake_driver_program(name, srcs, linkopts = [], deps = [], **kwargs):
    """A cc_binary linked to //tests/fakecuda:libcuda.so.1, as mlp_train is
    (so LD_PRELOAD of libstensor.so interposes its driver calls), with the
    CHECK macro of driver_check.h."""
    native.cc_binary(
        name = name,
        srcs = srcs,
        additional_linker_inputs = ["//tests/fakecuda:libcuda.so.1"],
        linkopts = ["$(location //tests/fakecuda:libcuda.so.1)"] + linkopts,
        deps = [
            ":driver_check",
            "@cuda//:headers",
        ] + deps,
        **kwargs
    )
