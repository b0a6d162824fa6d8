// RawLog: a message on stderr with nothing but write(2), for the places where
// the logger cannot be used: the library constructor, dlsym (which the
// loader and allocators may call at any time) and fatal start-up errors.
//
// Thread-safety: safe from any thread; a thread that re-enters (a hook
// logging from within a log call) is dropped instead of recursing.
#ifndef STENSOR_INTERPOSE_RAW_LOG_H_
#define STENSOR_INTERPOSE_RAW_LOG_H_

namespace stensor {

void RawLog(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace stensor

#endif  // STENSOR_INTERPOSE_RAW_LOG_H_
