// The CUDA runtime side of the backend (see runtime.h): devices, the caching pool, the default
// stream, host functions with their errors kept per stream, events, copies, fills, conversions.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

namespace mt::kernels::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// ---- the process's device: index, default stream and pool, made once -----------------------------
std::atomic<int> g_selected_device{0};
std::mutex g_device_mutex;
std::atomic<cudaStream_t> g_default_stream{nullptr};  // made once, under g_device_mutex
std::atomic<bool> g_device_in_use{false};

void make_pool_caching(int device) {
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keep_everything = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
        "cudaMemPoolSetAttribute(ReleaseThreshold)");
}

cudaMemPool_t device_pool() {
  bind_selected_device();
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, g_selected_device.load()), "cudaDeviceGetDefaultMemPool");
  return pool;
}

int64_t pool_attribute(cudaMemPoolAttr attribute, const char* what) {
  uint64_t value = 0;
  check(cudaMemPoolGetAttribute(device_pool(), attribute, &value), what);
  return static_cast<int64_t>(value);
}

// ---- host functions: a trampoline catches what the callback throws, kept per stream ----------------
struct HostCall {
  void (*function)(void*);
  void* argument;
  void* stream;
};

std::mutex g_host_errors_mutex;
std::map<void*, std::exception_ptr> g_host_errors;  // first error per stream since its synchronize

void CUDART_CB run_host_call(void* data) {
  const HostCall call = *static_cast<HostCall*>(data);
  delete static_cast<HostCall*>(data);
  try {
    call.function(call.argument);
  } catch (...) {
    const std::lock_guard<std::mutex> lock(g_host_errors_mutex);
    g_host_errors.try_emplace(call.stream, std::current_exception());
  }
}

std::exception_ptr take_host_error(void* stream) {
  const std::lock_guard<std::mutex> lock(g_host_errors_mutex);
  const auto found = g_host_errors.find(stream);
  if (found == g_host_errors.end()) return nullptr;
  std::exception_ptr error = found->second;
  g_host_errors.erase(found);
  return error;
}

// ---- events: CUDA's event and whether it was ever recorded (CUDA's own answer for an unrecorded
// event differs between versions) ------------------------------------------------------------------
struct TimedEvent {
  cudaEvent_t event = nullptr;
  bool recorded = false;
};

TimedEvent* as_event(void* event) { return static_cast<TimedEvent*>(event); }

void require_complete(const TimedEvent* event, const char* which) {
  if (!event->recorded) {
    throw std::logic_error(std::string("cuda backend: elapsed_seconds: the ") + which + " event was never recorded");
  }
  const cudaError_t status = cudaEventQuery(event->event);
  if (status == cudaErrorNotReady) {
    throw std::logic_error(std::string("cuda backend: elapsed_seconds: the ") + which +
                           " event has not completed (synchronize_event first)");
  }
  check(status, "cudaEventQuery");
}

// ---- element kernels: grid-stride loops over 64-bit indices ----------------------------------------
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

#define MT_GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);              \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void fill_kernel(float* x, int64_t n, float value) {
  MT_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void float_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = fp32_to_bf16_bits(in[i]);
}

__global__ void float_to_f16_kernel(const float* in, uint16_t* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = fp32_to_fp16_bits(in[i]);
}

__global__ void bf16_to_float_kernel(const uint16_t* in, float* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = bf16_bits_to_fp32(in[i]);
}

__global__ void f16_to_float_kernel(const uint16_t* in, float* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = fp16_bits_to_fp32(in[i]);
}

__global__ void round_through_bf16_kernel(const float* in, float* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = round_to_bf16(in[i]);
}

__global__ void round_through_f16_kernel(const float* in, float* out, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = fp16_bits_to_fp32(fp32_to_fp16_bits(in[i]));
}

#undef MT_GRID_STRIDE

// Queues kernel(args...) over n elements on `stream`; checks the launch.
template <typename... KernelArgs, typename... Args>
void launch_elementwise(void (*kernel)(KernelArgs...), int64_t n, void* stream, const char* what, Args... args) {
  if (n <= 0) return;
  bind_selected_device();
  kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(args...);
  check(cudaGetLastError(), what);
}

cudaMemcpyKind memcpy_kind(CopyDirection direction) {
  switch (direction) {
    case CopyDirection::device_to_device: return cudaMemcpyDeviceToDevice;
    case CopyDirection::host_to_device: return cudaMemcpyHostToDevice;
    case CopyDirection::device_to_host: return cudaMemcpyDeviceToHost;
  }
  return cudaMemcpyDefault;
}

}  // namespace

// ---- devices ----------------------------------------------------------------------------------------
int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clears the non-sticky error cudaGetDeviceCount left
    return 0;
  }
  return count;
}

std::string device_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
  }
  return count > 0 ? std::string() : std::string("no device visible");
}

void select_device(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw std::runtime_error("cuda backend: device " + std::to_string(index) + " of " + std::to_string(count) +
                             " visible");
  }
  const std::lock_guard<std::mutex> lock(g_device_mutex);
  if (g_device_in_use.load() && index != g_selected_device.load()) {
    throw std::logic_error("cuda backend: device " + std::to_string(index) + " selected after device " +
                           std::to_string(g_selected_device.load()) + " was put to use");
  }
  g_selected_device.store(index);
}

int selected_device() { return g_selected_device.load(); }

void bind_selected_device() {
  thread_local int bound = -1;
  const int wanted = g_selected_device.load();
  if (bound == wanted) return;
  check(cudaSetDevice(wanted), "cudaSetDevice");
  bound = wanted;
}

DeviceProperties device_properties(int index) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  DeviceProperties out;
  out.name = prop.name;
  out.compute_major = prop.major;
  out.compute_minor = prop.minor;
  out.multiprocessors = prop.multiProcessorCount;
  out.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  char bus_id[32] = {};
  check(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, index), "cudaDeviceGetPCIBusId");
  out.pci_bus_id = bus_id;
  return out;
}

int runtime_version() {
  int version = 0;
  cudaRuntimeGetVersion(&version);
  return version;
}

int driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return version;
}

int cublas_version() {
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return major * 10000 + minor * 100 + patch;
}

int nccl_version() {
  int version = 0;
  ncclGetVersion(&version);
  return version;
}

// ---- memory ------------------------------------------------------------------------------------------
void* allocate(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  cudaStream_t stream = as_stream(default_stream());
  void* data = nullptr;
  const cudaError_t status = cudaMallocAsync(&data, rounded, stream);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw std::bad_alloc();
  }
  check(status, "cudaMallocAsync");
  check(cudaMemsetAsync(data, 0, rounded, stream), "cudaMemsetAsync");
  return data;
}

void release(void* data) {
  if (!data) return;
  check(cudaFreeAsync(data, as_stream(default_stream())), "cudaFreeAsync");
}

int64_t pool_reserved_bytes() {
  return pool_attribute(cudaMemPoolAttrReservedMemCurrent, "cudaMemPoolGetAttribute(ReservedMemCurrent)");
}

int64_t pool_reserved_peak_bytes() {
  return pool_attribute(cudaMemPoolAttrReservedMemHigh, "cudaMemPoolGetAttribute(ReservedMemHigh)");
}

// ---- streams, host functions, events -------------------------------------------------------------------
void* default_stream() {
  if (cudaStream_t made = g_default_stream.load(std::memory_order_acquire)) return made;
  const std::lock_guard<std::mutex> lock(g_device_mutex);
  if (cudaStream_t made = g_default_stream.load(std::memory_order_acquire)) return made;
  bind_selected_device();
  make_pool_caching(g_selected_device.load());
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  g_device_in_use.store(true);
  g_default_stream.store(stream, std::memory_order_release);
  return stream;
}

void synchronize(void* stream) {
  check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  if (std::exception_ptr error = take_host_error(stream)) std::rethrow_exception(error);
}

void launch_host_function(void* stream, void (*function)(void*), void* argument) {
  bind_selected_device();
  auto* call = new HostCall{function, argument, stream};
  const cudaError_t status = cudaLaunchHostFunc(as_stream(stream), run_host_call, call);
  if (status != cudaSuccess) {
    delete call;
    check(status, "cudaLaunchHostFunc");
  }
}

void* create_event() {
  bind_selected_device();
  auto* event = new TimedEvent;
  const cudaError_t status = cudaEventCreate(&event->event);
  if (status != cudaSuccess) {
    delete event;
    check(status, "cudaEventCreate");
  }
  return event;
}

void destroy_event(void* event) {
  if (!event) return;
  cudaEventDestroy(as_event(event)->event);  // a destructor's path: nothing to report to
  delete as_event(event);
}

void record_event(void* event, void* stream) {
  check(cudaEventRecord(as_event(event)->event, as_stream(stream)), "cudaEventRecord");
  as_event(event)->recorded = true;
}

void synchronize_event(void* event) {
  if (!as_event(event)->recorded) return;  // nothing before it to wait for
  check(cudaEventSynchronize(as_event(event)->event), "cudaEventSynchronize");
}

double elapsed_seconds(void* start, void* end) {
  require_complete(as_event(start), "start");
  require_complete(as_event(end), "end");
  float milliseconds = 0;
  check(cudaEventElapsedTime(&milliseconds, as_event(start)->event, as_event(end)->event), "cudaEventElapsedTime");
  return milliseconds / 1e3;
}

// ---- copies, fills, conversions -------------------------------------------------------------------------
void copy(void* dst, const void* src, int64_t bytes, CopyDirection direction, void* stream) {
  if (bytes <= 0 || dst == src) return;
  bind_selected_device();
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), memcpy_kind(direction), as_stream(stream)),
        "cudaMemcpyAsync");
}

void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width_bytes, int64_t rows,
             CopyDirection direction, void* stream) {
  if (rows <= 0 || width_bytes <= 0) return;
  bind_selected_device();
  check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                          static_cast<size_t>(width_bytes), static_cast<size_t>(rows), memcpy_kind(direction),
                          as_stream(stream)),
        "cudaMemcpy2DAsync");
}

void fill(float* x, int64_t n, float value, void* stream) {
  launch_elementwise(fill_kernel, n, stream, "fill kernel", x, n, value);
}

void zero(void* x, int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  bind_selected_device();
  check(cudaMemsetAsync(x, 0, static_cast<size_t>(bytes), as_stream(stream)), "cudaMemsetAsync");
}

void float_to_half(const float* in, uint16_t* out, int64_t n, HalfType type, void* stream) {
  if (type == HalfType::bf16) {
    launch_elementwise(float_to_bf16_kernel, n, stream, "f32 -> bf16 kernel", in, out, n);
  } else {
    launch_elementwise(float_to_f16_kernel, n, stream, "f32 -> f16 kernel", in, out, n);
  }
}

void half_to_float(const uint16_t* in, float* out, int64_t n, HalfType type, void* stream) {
  if (type == HalfType::bf16) {
    launch_elementwise(bf16_to_float_kernel, n, stream, "bf16 -> f32 kernel", in, out, n);
  } else {
    launch_elementwise(f16_to_float_kernel, n, stream, "f16 -> f32 kernel", in, out, n);
  }
}

void round_through(const float* in, float* out, int64_t n, HalfType type, void* stream) {
  if (type == HalfType::bf16) {
    launch_elementwise(round_through_bf16_kernel, n, stream, "round through bf16 kernel", in, out, n);
  } else {
    launch_elementwise(round_through_f16_kernel, n, stream, "round through f16 kernel", in, out, n);
  }
}

}  // namespace mt::kernels::cuda
