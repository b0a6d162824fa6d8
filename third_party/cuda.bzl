"""Repository rule exposing the CUDA toolkit's headers as @cuda//:headers.

The toolkit is found at $CUDA_PATH, else /usr/local/cuda. Only headers are used:
nothing in the default build links against a real libcuda.
"""

def _cuda_headers_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    include = ctx.path(root + "/include")
    if not include.get_child("cuda.h").exists:
        fail("cuda.h not found under %s; install the CUDA toolkit or set CUDA_PATH" % include)
    ctx.symlink(include, "include")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp"]),
    includes = ["include"],
)
""")

cuda_headers_repository = repository_rule(
    implementation = _cuda_headers_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
