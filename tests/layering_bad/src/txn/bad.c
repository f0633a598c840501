/* A layering violation the check must report (tests/CMakeLists.txt: layering_detects). */
#include "runtime/runtime_internal.h"
