# Sourced by the tests that preload libstensor.so.
#
#   preload_of LIB...   prints the LD_PRELOAD value that preloads LIBs in
#                       that order
#
# A library built with AddressSanitizer (--config=asan) needs the ASan
# runtime first in the initial library list, or ASan refuses to start
# ("ASan runtime does not come first"): the runtime a LIB links is put
# before them. Without a sanitizer this is just the LIBs.
preload_of() {
  local lib runtime=""
  for lib in "$@"; do
    [[ -n $runtime ]] || runtime=$(ldd "$lib" 2> /dev/null | awk '$1 ~ /^libasan\.so/ {print $3; exit}')
  done
  local IFS=:
  echo "${runtime:+$runtime:}$*"
}
