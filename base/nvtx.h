// NVTX ranges in a "pswitch" domain, so Nsight Systems shows pswitch's own events (group
// copies, tasks, the groups they compute, bubbles) beside the CUDA calls. Header-only NVTX 3:
// without a tool attached every call is a cheap no-op, and builds without the CUDA toolkit
// compile these to nothing.
#ifndef PSWITCH_BASE_NVTX_H_
#define PSWITCH_BASE_NVTX_H_

#include <cstdint>
#include <string>

#ifdef PSWITCH_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace pswitch::base {

#ifdef PSWITCH_WITH_NVTX
namespace nvtx_internal {
inline nvtxDomainHandle_t Domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("pswitch");
  return domain;
}
inline nvtxEventAttributes_t Attributes(const char* message) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = message;
  return a;
}
}  // namespace nvtx_internal

inline constexpr bool kNvtxBuilt = true;
// A range that may end on another thread or out of order (a copy observed later, a bubble).
inline uint64_t NvtxStart(const std::string& name) {
  nvtxEventAttributes_t a = nvtx_internal::Attributes(name.c_str());
  return nvtxDomainRangeStartEx(nvtx_internal::Domain(), &a);
}
inline void NvtxEnd(uint64_t id) {
  if (id != 0) nvtxDomainRangeEnd(nvtx_internal::Domain(), id);
}
inline void NvtxMark(const std::string& name) {
  nvtxEventAttributes_t a = nvtx_internal::Attributes(name.c_str());
  nvtxDomainMarkEx(nvtx_internal::Domain(), &a);
}
#else
inline constexpr bool kNvtxBuilt = false;
inline uint64_t NvtxStart(const std::string&) { return 0; }
inline void NvtxEnd(uint64_t) {}
inline void NvtxMark(const std::string&) {}
#endif

// A range over a scope, or over an explicit Restart..Restart..End sequence (a task's groups).
class NvtxRange {
 public:
  NvtxRange() = default;
  explicit NvtxRange(const std::string& name) : id_(NvtxStart(name)) {}
  ~NvtxRange() { End(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

  void Restart(const std::string& name) {
    End();
    id_ = NvtxStart(name);
  }
  void End() {
    NvtxEnd(id_);
    id_ = 0;
  }

 private:
  uint64_t id_ = 0;
};

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_NVTX_H_
