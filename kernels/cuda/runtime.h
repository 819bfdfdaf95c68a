// The CUDA runtime side of the backend op table, callable from plain C++ (no CUDA headers here, so
// lib/ and tests compile with the host compiler): device discovery and selection, stream-ordered
// device memory from a caching pool, the process's default stream, host functions queued on a
// stream with their exceptions carried to the stream's synchronize, timing events, copies, fills
// and the f32 <-> bf16/f16 conversions (round to nearest even, kernels/common/half.h's functions
// in the kernel). lib/backend/cuda_backend.cpp wraps these into backend::Ops entries; the contracts
// are lib/backend/ops.h's. A failing CUDA call throws std::runtime_error naming the call and CUDA's
// error text; out of device memory throws std::bad_alloc. Streams, events and pointers cross this
// header as void*. Tested on a GPU in tests/gpu/test_cuda_runtime.cpp (CTest label gpu, skipped
// without a device); the refusal without a device in tests/unit/backend/test_registry.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace mt::kernels::cuda {

// ---- devices ---------------------------------------------------------------------------------
// Devices visible to this process (after CUDA_VISIBLE_DEVICES); 0 when there is no driver or no
// device (never throws).
int device_count();
// Empty when a device is usable; else why not, as CUDA says it ("cudaGetDeviceCount: no
// CUDA-capable device is detected", or "no device visible" when the count is 0).
std::string device_unavailable_reason();
// Binds the process to device `index` (0 <= index < device_count()): every later call on any
// host thread runs on it. Call before the first stream, event or allocation; a later call with
// another index throws std::logic_error (the default stream and the pool belong to one device).
void select_device(int index);
int selected_device();  // 0 until select_device
// Makes the selected device current on the calling host thread (cheap after the first call on
// a thread): CUDA's current device is per thread.
void bind_selected_device();

struct DeviceProperties {
  std::string name;                // e.g. "NVIDIA H100 80GB HBM3"
  int compute_major = 0;           // 9 for sm_90
  int compute_minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;        // global memory
  std::string pci_bus_id;          // e.g. "0000:1B:00.0"
};
DeviceProperties device_properties(int index);

int runtime_version();  // e.g. 13000
int driver_version();   // the CUDA version the driver supports, e.g. 13000; 0 without a driver
int cublas_version();   // e.g. 130100
int nccl_version();     // e.g. 22809

// ---- memory: cudaMallocAsync from the device's pool on the default stream -------------------------
// The pool keeps freed blocks (release threshold UINT64_MAX), so a freed block is reused by the
// next allocation instead of going back to the driver. Allocation and release are ordered on the
// default stream: work on another stream must wait for an event recorded there after allocate.
// `bytes` rounded up to 64, zero-filled (cudaMemsetAsync); std::bad_alloc when out of memory.
void* allocate(int64_t bytes);
void release(void* data);
// Bytes the pool holds from the driver now and at most (cudaMemPoolAttrReservedMemCurrent/High).
int64_t pool_reserved_bytes();
int64_t pool_reserved_peak_bytes();

// ---- streams, host functions, events ---------------------------------------------------------------
// One non-blocking stream per process on the selected device, made at the first call.
void* default_stream();
// cudaStreamSynchronize, then rethrows the first exception a host function queued on `stream`
// threw since the last synchronize of `stream`.
void synchronize(void* stream);
// Runs function(argument) on CUDA's callback thread once the work queued before it has finished
// (cudaLaunchHostFunc); an exception it throws is kept for the next synchronize(stream).
void launch_host_function(void* stream, void (*function)(void*), void* argument);
void* create_event();  // timing enabled
void destroy_event(void* event);
void record_event(void* event, void* stream);
void synchronize_event(void* event);
// Seconds between two recorded events; std::logic_error when either was never recorded or has
// not completed.
double elapsed_seconds(void* start, void* end);

// ---- copies, fills, conversions (queued on `stream`) ----------------------------------------------
enum class CopyDirection { device_to_device, host_to_device, device_to_host };
// Host memory may be pageable: CUDA then stages it through a pinned buffer and the copy does not
// overlap with the host (a host_to_device copy from pageable memory returns once the source has
// been read; device_to_host from pageable memory returns when the data has arrived).
void copy(void* dst, const void* src, int64_t bytes, CopyDirection direction, void* stream);
void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width_bytes, int64_t rows,
             CopyDirection direction, void* stream);
void fill(float* x, int64_t n, float value, void* stream);
void zero(void* x, int64_t bytes, void* stream);
// The 16-bit types of the conversions, as bits.
enum class HalfType { bf16, f16 };
void float_to_half(const float* in, uint16_t* out, int64_t n, HalfType type, void* stream);
void half_to_float(const uint16_t* in, float* out, int64_t n, HalfType type, void* stream);
// out[i] = in[i] rounded to the nearest `type` value, in fp32 storage (in == out allowed).
void round_through(const float* in, float* out, int64_t n, HalfType type, void* stream);

}  // namespace mt::kernels::cuda
