#include "gpu/cuda/cuda_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/shared_flags.h"
#include "base/status.h"

namespace pswitch::gpu::cuda {
namespace {

// Side-stream work (fills, checkpoint copies) waits on no flag; this only bounds a broken GPU.
constexpr absl::Duration kSideStreamTimeout = absl::Seconds(60);

// CPU side: the shared host words (atomics, futex for CPU writers, polling for device writes).
// Device side: the registered page's device alias, for stream memory operations.
class CudaFlagArray : public SharedFlagArray {
 public:
  CudaFlagArray(uint32_t* host_words, CUdeviceptr device_words, uint32_t count, uint64_t offset)
      : SharedFlagArray(host_words, count, offset, /*device_writes=*/true),
        device_words_(device_words) {}
  CUdeviceptr Address(uint32_t index) const {
    return device_words_ + CUdeviceptr{index} * sizeof(uint32_t);
  }

 private:
  const CUdeviceptr device_words_;
};

absl::StatusOr<std::byte*> MapShared(int fd, uint64_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap flag window of ", bytes, " bytes"));
  return static_cast<std::byte*>(base);
}

}  // namespace

class CudaArena::FlagWindow {
 public:
  // Creates (fd invalid) or maps (fd from an exported handle) the window and registers it.
  static absl::StatusOr<std::unique_ptr<FlagWindow>> Open(UniqueFd fd, uint64_t bytes) {
    if (!fd.valid()) {
      fd.Reset(::memfd_create("pswitch-flags", MFD_CLOEXEC));
      if (!fd.valid()) return ErrnoStatus("memfd_create flag window");
      if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
        return ErrnoStatus("ftruncate flag window");
      }
    } else {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat flag window");
      if (static_cast<uint64_t>(st.st_size) != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("flag window fd holds ", st.st_size,
                                                       " bytes, expected ", bytes));
      }
    }
    PSWITCH_ASSIGN_OR_RETURN(std::byte * host, MapShared(fd.get(), bytes));
    std::unique_ptr<FlagWindow> window(new FlagWindow(std::move(fd), host, bytes));
    // Portable: every context of this process sees it; Mapped: it has a device alias.
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(
        cudaHostRegister(host, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped)));
    window->registered_ = true;
    void* device = nullptr;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaHostGetDevicePointer(&device, host, 0)));
    window->device_ = reinterpret_cast<CUdeviceptr>(device);
    return window;
  }
  ~FlagWindow() {
    if (registered_) (void)cudaHostUnregister(host_);
    ::munmap(host_, bytes_);
  }
  int fd() const { return fd_.get(); }
  uint64_t bytes() const { return bytes_; }
  uint32_t* host_words(uint64_t offset) const {
    return reinterpret_cast<uint32_t*>(host_ + offset);
  }
  CUdeviceptr device_words(uint64_t offset) const { return device_ + offset; }

 private:
  FlagWindow(UniqueFd fd, std::byte* host, uint64_t bytes)
      : fd_(std::move(fd)), host_(host), bytes_(bytes) {}
  UniqueFd fd_;
  std::byte* const host_;
  const uint64_t bytes_;
  bool registered_ = false;
  CUdeviceptr device_ = 0;
};

absl::StatusOr<CUdeviceptr> FlagAddress(const FlagArray& flags, uint32_t index) {
  auto* cuda_flags = dynamic_cast<const CudaFlagArray*>(&flags);
  if (cuda_flags == nullptr) return absl::InvalidArgumentError("not a CUDA flag array");
  if (index >= flags.size()) return absl::OutOfRangeError(absl::StrCat("flag index ", index));
  return cuda_flags->Address(index);
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(const DriverApi* api) {
  cudaStream_t stream = nullptr;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  return std::unique_ptr<CudaStream>(new CudaStream(stream, api));
}

CudaStream::~CudaStream() {
  for (cudaEvent_t e : mark_events_) (void)cudaEventDestroy(e);
  (void)cudaStreamDestroy(stream_);
}

absl::Status CudaStream::Mark() {
  if (mark_events_.empty()) {
    for (size_t i = 0; i <= kMaxStreamMarks; ++i) {
      cudaEvent_t e = nullptr;
      PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventCreate(&e)));
      mark_events_.push_back(e);
    }
  }
  if (marks_ >= kMaxStreamMarks) return absl::ResourceExhaustedError("too many stream marks");
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(mark_events_[marks_], stream_)));
  ++marks_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CudaStream::TakeMarks() {
  const size_t n = std::exchange(marks_, 0);
  std::vector<int64_t> times;
  if (n == 0) return times;
  // The stream is idle: an end mark recorded now completes at once, so the host time read right
  // after it anchors the device clock to within the call's own latency.
  cudaEvent_t end = mark_events_[kMaxStreamMarks];
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(end, stream_)));
  PSWITCH_RETURN_IF_ERROR(Synchronize(absl::Seconds(1)));
  const int64_t end_ns = base::MonotonicNowNs();
  for (size_t i = 0; i < n; ++i) {
    float ms = 0;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventElapsedTime(&ms, mark_events_[i], end)));
    times.push_back(end_ns - static_cast<int64_t>(static_cast<double>(ms) * 1e6));
  }
  return times;
}

absl::Status CudaStream::WaitFlag(const FlagArray& flags, uint32_t index, uint32_t epoch,
                                  absl::Duration timeout) {
  PSWITCH_ASSIGN_OR_RETURN(CUdeviceptr address, FlagAddress(flags, index));
  absl::MutexLock lock(&waits_mu_);
  // Forget the waits of work that has finished, so the list stays as short as the stream's
  // backlog (cudaStreamQuery costs about a microsecond).
  if (!waits_.empty() && cudaStreamQuery(stream_) == cudaSuccess) waits_.clear();
  // Fail now rather than enqueue behind a wait that has already outlived its bound.
  PSWITCH_RETURN_IF_ERROR(CheckWaits(absl::Now()));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(api_->stream_wait_value32(
      reinterpret_cast<CUstream>(stream_), address, epoch, CU_STREAM_WAIT_VALUE_GEQ)));
  waits_.push_back(PendingWait{&flags, index, epoch, absl::Now() + timeout});
  return absl::OkStatus();
}

absl::Status CudaStream::CheckWaits(absl::Time now) const {
  for (const PendingWait& wait : waits_) {
    if (now <= wait.deadline) continue;
    absl::StatusOr<uint32_t> seen = wait.flags->Load(wait.index);
    if (seen.ok() && EpochReached(*seen, wait.epoch)) continue;
    return absl::DeadlineExceededError(
        absl::StrCat("the stream waits on flag ", wait.index, " for epoch ", wait.epoch,
                     ", which it has not reached past the wait's timeout (it holds ",
                     seen.ok() ? absl::StrCat(*seen) : std::string(seen.status().message()),
                     "); the work behind the wait stays queued until the flag is written"));
  }
  return absl::OkStatus();
}

absl::Status CudaStream::WriteFlag(FlagArray& flags, uint32_t index, uint32_t value) {
  PSWITCH_ASSIGN_OR_RETURN(CUdeviceptr address, FlagAddress(flags, index));
  return PSWITCH_CU(api_->stream_write_value32(reinterpret_cast<CUstream>(stream_), address, value,
                                               CU_STREAM_WRITE_VALUE_DEFAULT));
}

absl::Status CudaStream::Synchronize(absl::Duration timeout) {
  // Poll rather than block: the stream may wait on a flag that is written late or never.
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(1);
  while (true) {
    cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) {
      // Asked again under the lock: a wait enqueued since the first look is kept.
      absl::MutexLock lock(&waits_mu_);
      if (cudaStreamQuery(stream_) == cudaSuccess) waits_.clear();
      return absl::OkStatus();
    }
    if (state != cudaErrorNotReady) return CudaStatus(state, "cudaStreamQuery");
    const absl::Time now = absl::Now();
    {
      // A wait past its own timeout fails the synchronize now, naming its flag.
      absl::MutexLock lock(&waits_mu_);
      PSWITCH_RETURN_IF_ERROR(CheckWaits(now));
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "stream still busy after ", absl::FormatDuration(timeout),
          " (waiting on a flag that was never written?)"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Microseconds(50));
  }
}

absl::StatusOr<std::unique_ptr<CudaArena>> CudaArena::Create(int device, uint64_t bytes,
                                                             const DriverApi* api, bool vmm) {
  if (bytes == 0) return absl::InvalidArgumentError("arena size must be positive");
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device)));
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> side, CudaStream::Create(api));
  std::unique_ptr<VmmMemory> memory;
  void* base = nullptr;
  if (vmm) {
    PSWITCH_ASSIGN_OR_RETURN(const VmmApi* vmm_api, GetVmmApi());
    PSWITCH_ASSIGN_OR_RETURN(memory, VmmMemory::Create(device, bytes, vmm_api));
    base = memory->base();
  } else {
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMalloc(&base, bytes)));
  }
  auto window = FlagWindow::Open(UniqueFd(), std::min(bytes, kFlagWindowBytes));
  if (!window.ok()) {
    if (memory == nullptr) (void)cudaFree(base);
    return window.status();
  }
  std::unique_ptr<CudaArena> arena(new CudaArena(device, static_cast<std::byte*>(base), bytes,
                                                 /*owner=*/true, std::move(memory), std::move(side),
                                                 std::move(*window)));
  PSWITCH_RETURN_IF_ERROR(arena->Fill(0, bytes, 0));
  return arena;
}

absl::StatusOr<std::unique_ptr<CudaArena>> CudaArena::Import(int device, ArenaHandle handle,
                                                             const DriverApi* api) {
  const bool vmm = handle.chunk_bytes > 0;
  if (handle.backend != Backend::kCuda ||
      (!vmm && handle.ipc_handle.size() != sizeof(cudaIpcMemHandle_t))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a CUDA arena handle (", handle.ipc_handle.size(), " IPC handle bytes, no chunks)"));
  }
  if (!handle.fd.valid()) {
    return absl::InvalidArgumentError("CUDA arena handle carries no flag-window fd");
  }
  if (handle.size_bytes == 0) return absl::InvalidArgumentError("CUDA arena handle of 0 bytes");
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device)));
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> side, CudaStream::Create(api));
  PSWITCH_ASSIGN_OR_RETURN(
      std::unique_ptr<FlagWindow> window,
      FlagWindow::Open(std::move(handle.fd), std::min(handle.size_bytes, kFlagWindowBytes)));
  std::unique_ptr<VmmMemory> memory;
  void* base = nullptr;
  if (vmm) {
    PSWITCH_ASSIGN_OR_RETURN(const VmmApi* vmm_api, GetVmmApi());
    PSWITCH_ASSIGN_OR_RETURN(
        memory, VmmMemory::Import(device, handle.size_bytes, handle.chunk_bytes, vmm_api,
                                  std::move(handle.chunks)));
    base = memory->base();
  } else {
    cudaIpcMemHandle_t ipc;
    std::memcpy(&ipc, handle.ipc_handle.data(), sizeof(ipc));
    PSWITCH_RETURN_IF_ERROR(
        PSWITCH_CUDA(cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess)));
  }
  return std::unique_ptr<CudaArena>(
      new CudaArena(device, static_cast<std::byte*>(base), handle.size_bytes, /*owner=*/false,
                    std::move(memory), std::move(side), std::move(window)));
}

CudaArena::CudaArena(int device, std::byte* base, uint64_t bytes, bool owner,
                     std::unique_ptr<VmmMemory> vmm, std::unique_ptr<CudaStream> side_stream,
                     std::unique_ptr<FlagWindow> flags)
    : device_(device),
      base_(base),
      size_bytes_(bytes),
      owner_(owner),
      vmm_(std::move(vmm)),
      flag_window_(std::move(flags)),
      side_stream_(std::move(side_stream)) {}

CudaArena::~CudaArena() {
  (void)cudaSetDevice(device_);
  flag_window_.reset();
  if (vmm_ != nullptr) {
    // cudaFree waits for the device; unmapping and releasing chunks need not, so work a timed-out
    // fill or copy left on the side stream finishes first.
    (void)side_stream_->Synchronize(absl::Seconds(5));
    vmm_.reset();
  } else if (owner_) {
    (void)cudaFree(base_);
  } else {
    (void)cudaIpcCloseMemHandle(base_);
  }
}

absl::StatusOr<ArenaHandle> CudaArena::Export() const {
  if (!owner_) return absl::FailedPreconditionError("only the arena's creator can export it");
  ArenaHandle handle;
  handle.backend = Backend::kCuda;
  handle.device_ordinal = device_;
  handle.size_bytes = size_bytes_;
  if (vmm_ != nullptr) {
    // In-process importers (bench-transfer, tests) fetch chunks from the owner directly; the
    // memdaemon's workers through its socket (memdaemon::ArenaClient). Valid while it lives.
    handle.chunk_bytes = vmm_->granularity();
    handle.chunks = [memory = vmm_.get()](uint64_t first, uint64_t count) {
      return memory->ExportChunks(first, count);
    };
  } else {
    cudaIpcMemHandle_t ipc;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaIpcGetMemHandle(&ipc, base_)));
    handle.ipc_handle.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
  }
  handle.fd.Reset(::fcntl(flag_window_->fd(), F_DUPFD_CLOEXEC, 0));
  if (!handle.fd.valid()) return ErrnoStatus("dup flag window fd");
  return handle;
}

uint64_t CudaArena::access_granularity() const { return vmm_ == nullptr ? 0 : vmm_->granularity(); }

bool CudaArena::read_only_access() const { return vmm_ == nullptr || vmm_->read_only_supported(); }

absl::Status CudaArena::RestrictAccess() {
  if (owner_) return absl::FailedPreconditionError("the arena's owner keeps access to all of it");
  if (vmm_ == nullptr) return Arena::RestrictAccess();
  // A VMM import has nothing mapped until granted; what is left is to learn whether a read
  // grant can be read-only.
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
  PSWITCH_RETURN_IF_ERROR(vmm_->ProbeReadOnly());
  restricted_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UniqueFd>> CudaArena::ExportChunks(uint64_t first,
                                                              uint64_t count) const {
  if (vmm_ == nullptr) return Arena::ExportChunks(first, count);
  return vmm_->ExportChunks(first, count);
}

absl::Status CudaArena::SetAccess(uint64_t offset, uint64_t bytes, Access access) {
  if (!restricted_) {
    return absl::FailedPreconditionError("access to an unrestricted arena is already total");
  }
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, bytes));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
  return vmm_->SetAccess(offset, bytes, access);
}

absl::StatusOr<Arena::Access> CudaArena::AccessAt(uint64_t offset) const {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, 1));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
  return DeviceAccessAt(base_ + offset);
}

absl::Status CudaArena::Fill(uint64_t offset, uint64_t bytes, uint8_t value) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, bytes));
  PSWITCH_RETURN_IF_ERROR(
      PSWITCH_CUDA(cudaMemsetAsync(base_ + offset, value, bytes, side_stream_->get())));
  return side_stream_->Synchronize(kSideStreamTimeout);
}

absl::Status CudaArena::CopyToHost(uint64_t offset, std::span<std::byte> out) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemcpyAsync(
      out.data(), base_ + offset, out.size(), cudaMemcpyDeviceToHost, side_stream_->get())));
  return side_stream_->Synchronize(kSideStreamTimeout);
}

absl::Status CudaArena::CopyFromHost(uint64_t offset, std::span<const std::byte> in) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, in.size()));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemcpyAsync(
      base_ + offset, in.data(), in.size(), cudaMemcpyHostToDevice, side_stream_->get())));
  return side_stream_->Synchronize(kSideStreamTimeout);
}

absl::StatusOr<std::unique_ptr<FlagArray>> CudaArena::Flags(uint64_t offset, uint32_t count) {
  PSWITCH_RETURN_IF_ERROR(CheckFlagPlacement(offset, count));
  return std::make_unique<CudaFlagArray>(flag_window_->host_words(offset),
                                         flag_window_->device_words(offset), count, offset);
}

PinnedReleaser::PinnedReleaser(int device) : device_(device), thread_([this] { Run(); }) {}

PinnedReleaser::~PinnedReleaser() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void PinnedReleaser::Release(void* data) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(data);
}

void PinnedReleaser::Run() {
  (void)cudaSetDevice(device_);
  while (true) {
    std::vector<void*> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything queued is freed
      batch.swap(queue_);
    }
    // A failure here leaves nothing to undo; the buffer's owner is long gone.
    for (void* data : batch) (void)cudaFreeHost(data);
  }
}

absl::StatusOr<std::unique_ptr<CudaHostBuffer>> CudaHostBuffer::Allocate(
    uint64_t bytes, std::shared_ptr<PinnedReleaser> releaser) {
  if (bytes == 0) return absl::InvalidArgumentError("pinned buffer size must be positive");
  if (releaser == nullptr) return absl::InvalidArgumentError("pinned buffer without a releaser");
  void* data = nullptr;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaHostAlloc(&data, bytes, cudaHostAllocPortable)));
  return std::unique_ptr<CudaHostBuffer>(
      new CudaHostBuffer(static_cast<std::byte*>(data), bytes, std::move(releaser)));
}

CudaHostBuffer::~CudaHostBuffer() { releaser_->Release(data_); }

}  // namespace pswitch::gpu::cuda
