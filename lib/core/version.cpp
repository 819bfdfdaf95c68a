// Build provenance (see version.h); values come from the generated core/build_info.h.
#include "core/version.h"

#include "core/build_info.h"

namespace mt {

const BuildInfo& build_info() {
  static const BuildInfo info{
      MT_VERSION, MT_GIT_COMMIT, MT_BUILD_TYPE, MT_CXX_COMPILER,
#ifdef MT_WITH_CUDA
      true, true,
#else
      false, false,
#endif
      true, "oneDNN"};
  return info;
}

}  // namespace mt
