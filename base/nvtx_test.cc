// base/nvtx.h against a tool: the test installs itself through NVTX's static-injection hook
// (the pointer a profiler's static library would provide) and records what the wrapper emits.
// Without the CUDA toolkit's NVTX headers the wrapper is compiled out, and the test says so.
#include "base/nvtx.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

#ifdef PSWITCH_WITH_NVTX
namespace {

struct Recorded {
  std::string kind;  // "mark", "start", "end"
  std::string domain;
  std::string name;
  uint64_t id = 0;
};

std::mutex mu;
std::vector<Recorded> events;
std::map<nvtxDomainHandle_t, std::string> domains;
uint64_t next_id = 1;
int domain_storage[8];

nvtxDomainHandle_t DomainCreateA(const char* name) {
  std::lock_guard<std::mutex> lock(mu);
  auto handle = reinterpret_cast<nvtxDomainHandle_t>(&domain_storage[domains.size() % 8]);
  domains[handle] = name;
  return handle;
}
void DomainMarkEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  std::lock_guard<std::mutex> lock(mu);
  events.push_back({"mark", domains[domain], a->message.ascii, 0});
}
nvtxRangeId_t DomainRangeStartEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  std::lock_guard<std::mutex> lock(mu);
  events.push_back({"start", domains[domain], a->message.ascii, next_id});
  return next_id++;
}
void DomainRangeEnd(nvtxDomainHandle_t domain, nvtxRangeId_t id) {
  std::lock_guard<std::mutex> lock(mu);
  events.push_back({"end", domains[domain], "", id});
}

int Initialize(NvtxGetExportTableFunc_t get_export_table) {
  auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr ||
      !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
      size <= NVTX_CBID_CORE2_DomainCreateA) {
    return 0;
  }
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&DomainCreateA);
  *table[NVTX_CBID_CORE2_DomainMarkEx] = reinterpret_cast<NvtxFunctionPointer>(&DomainMarkEx);
  *table[NVTX_CBID_CORE2_DomainRangeStartEx] =
      reinterpret_cast<NvtxFunctionPointer>(&DomainRangeStartEx);
  *table[NVTX_CBID_CORE2_DomainRangeEnd] = reinterpret_cast<NvtxFunctionPointer>(&DomainRangeEnd);
  return 1;
}

}  // namespace
#endif

namespace pswitch::base {
namespace {

TEST(NvtxTest, RangesAndMarksReachAToolInThePswitchDomain) {
#ifndef PSWITCH_WITH_NVTX
  GTEST_SKIP() << "built without the CUDA toolkit's NVTX headers: base/nvtx.h compiles to nothing";
#else
  // Before the process's first NVTX call, which loads the tool; a profiler's would come first.
  ::unsetenv("NVTX_INJECTION64_PATH");
  InitializeInjectionNvtx2_fnptr = &Initialize;
  {
    NvtxRange task("infer m task 7");
    NvtxRange group;
    group.Restart("group 0");
    group.Restart("group 1");
    NvtxMark("preempt");
  }
  // A range ended on another thread (a copy seen complete, a bubble's end).
  const uint64_t bubble = NvtxStart("bubble gpu 0");
  std::thread([bubble] { NvtxEnd(bubble); }).join();
  NvtxEnd(0);  // no range: nothing

  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::string> seen;
  for (const Recorded& e : events) {
    EXPECT_EQ(e.domain, "pswitch") << e.kind << " " << e.name;
    seen.push_back(e.kind + " " + e.name + (e.kind == "end" ? std::to_string(e.id) : ""));
  }
  ASSERT_EQ(events.size(), 9u);
  const uint64_t task_id = events[0].id, g0 = events[1].id, g1 = events[3].id;
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "start infer m task 7", "start group 0", "end " + std::to_string(g0),
                      "start group 1", "mark preempt", "end " + std::to_string(g1),
                      "end " + std::to_string(task_id), "start bubble gpu 0",
                      "end " + std::to_string(bubble)}));
#endif
}

}  // namespace
}  // namespace pswitch::base
