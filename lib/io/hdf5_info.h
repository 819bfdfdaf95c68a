// HDF5 library facts for provenance records.
#pragma once

#include <string>

namespace mt::io {

std::string hdf5_version();  // e.g. "1.10.8 (parallel)"

}  // namespace mt::io
