// HDF5 library facts (see hdf5_info.h).
#include "io/hdf5_info.h"

#include <hdf5.h>

namespace mt::io {

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  std::string text = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
#ifdef H5_HAVE_PARALLEL
  text += " (parallel)";
#endif
  return text;
}

}  // namespace mt::io
