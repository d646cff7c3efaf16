// pswitch._pswitch: the C++ client library (client/client.h) for Python. One implementation: this
// file only converts. Every call that waits on the server releases the GIL; errors raise the
// exception class pswitch.errors maps the absl status code to. Results are plain dicts and
// numpy arrays; pswitch/client.py turns them into the package's types. Over the Unix socket,
// inputs are area tensors (an array that already views the area is sent as its slice, anything
// else is copied in once) and outputs are numpy views of the area (docs/python.md's lifetime
// rule).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "proto/dtype.h"

namespace py = pybind11;

namespace pswitch::python {
namespace {

[[noreturn]] void Raise(const absl::Status& status) {
  py::object errors = py::module_::import("pswitch.errors");
  py::object error = errors.attr("from_status")(absl::StatusCodeToString(status.code()),
                                                std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

template <typename T>
T Check(absl::StatusOr<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(*result);
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

absl::Duration Seconds(double s) { return absl::Nanoseconds(static_cast<int64_t>(s * 1e9)); }
double ToSeconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

py::object StatusOrNone(const absl::Status& status) {
  if (status.ok()) return py::none();
  py::object errors = py::module_::import("pswitch.errors");
  return errors.attr("from_status")(absl::StatusCodeToString(status.code()),
                                    std::string(status.message()));
}

// pswitch's dtype for numpy's `dtype` (the one table, proto/dtype.h); TypeError naming `name`.
const proto::DTypeInfo& NumpyDType(const std::string& name, const py::dtype& dtype) {
  for (const proto::DTypeInfo& row : proto::kDTypes) {
    if (row.numpy != nullptr && dtype.is(py::dtype(std::string(row.numpy)))) return row;
  }
  throw py::type_error(absl::StrCat("input '", name, "' has dtype ",
                                    std::string(py::str(py::handle(dtype))),
                                    "; pswitch takes float32, float16, int64, int32 or uint8"));
}

// A numpy array (float32, int64 or int32, any layout) as the wire's tensor: one copy, made
// while the GIL is held.
proto::HostTensor FromNumpy(const std::string& name, const py::array& array) {
  proto::HostTensor t;
  t.name = name;
  t.dtype = NumpyDType(name, array.dtype()).wire;
  auto contiguous = py::array::ensure(array, py::array::c_style);
  if (!contiguous) throw py::type_error("input is not convertible to a contiguous array");
  t.shape.assign(contiguous.shape(), contiguous.shape() + contiguous.ndim());
  const auto* bytes = static_cast<const uint8_t*>(contiguous.data());
  t.data.assign(bytes, bytes + contiguous.nbytes());
  return t;
}

// The output's bytes become the numpy array's memory (no copy): a capsule owns them.
py::array ToNumpy(proto::HostTensor tensor) {
  const proto::DTypeInfo* info = proto::FindDType(tensor.dtype);
  if (info == nullptr || info->numpy == nullptr) {
    throw py::type_error(absl::StrCat("output '", tensor.name, "' has a dtype numpy lacks"));
  }
  const py::dtype dtype(std::string(info->numpy));
  auto* owned = new std::vector<uint8_t>(std::move(tensor.data));
  py::capsule free(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
  return py::array(dtype, tensor.shape, owned->data(), free);
}

// A numpy view of an area tensor (no copy). The array's capsule holds the tensor, so its span
// stays out of the allocator's hands while the array, or any view or torch tensor made from it,
// lives; the last one's collection gives the space back.
py::array AreaToNumpy(client::AreaTensor tensor) {
  const proto::DTypeInfo* info = proto::FindDType(tensor.dtype());
  if (info == nullptr || info->numpy == nullptr) {
    throw py::type_error(absl::StrCat("output '", tensor.name(), "' has a dtype numpy lacks"));
  }
  const py::dtype dtype(std::string(info->numpy));
  auto* owned = new client::AreaTensor(std::move(tensor));
  py::capsule free(owned, [](void* p) { delete static_cast<client::AreaTensor*>(p); });
  return py::array(dtype, owned->shape(), owned->data(), free);
}

// An input array as an area tensor: its own bytes when it is a C-contiguous view inside a live
// span (Client.tensor's arrays and views of them: sent with no copy), else one copy into a new
// span, strided or not. Holds the GIL except while a span is allocated (that may register an
// area: a round trip); the allocator's error (ResourceExhausted when the areas are full).
absl::StatusOr<client::AreaTensor> ToArea(client::Client& c, const std::string& name,
                                          const py::array& array) {
  const proto::DTypeInfo& info = NumpyDType(name, array.dtype());
  std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
  const uint64_t bytes = static_cast<uint64_t>(array.nbytes());
  if ((array.flags() & py::array::c_style) != 0 && bytes > 0) {
    if (std::shared_ptr<client::AreaSpan> span = c.areas()->Find(array.data(), bytes)) {
      const uint64_t offset =
          static_cast<uint64_t>(static_cast<const uint8_t*>(array.data()) - span->data());
      return client::AreaTensor(name, info.wire, std::move(shape), std::move(span), offset, bytes);
    }
  }
  absl::StatusOr<client::AreaTensor> placed;
  {
    py::gil_scoped_release release;
    placed = c.Tensor(shape, info.wire, name);
  }
  if (!placed.ok()) return placed.status();
  // numpy copies into the area view, whatever the source's strides: the one copy.
  py::array view = AreaToNumpy(*placed);
  py::module_::import("numpy").attr("copyto")(view, array);
  return placed;
}

py::dict TaskStatusDict(const client::TaskStatus& s) {
  py::dict d;
  d["task_id"] = s.task_id;
  d["model"] = s.model;
  d["state"] = absl::AsciiStrToLower(client::TaskStateName(s.state));
  d["iterations_done"] = s.iterations_done;
  d["preemptions"] = s.preemptions;
  d["worker_pid"] = s.worker_pid;
  d["error"] = StatusOrNone(s.error);
  d["clean_time_s"] = ToSeconds(s.clean_time);
  d["cleaned_after_drain"] = s.cleaned_after_drain;
  return d;
}

py::dict FillStatusDict(const client::FillJobStatus& s) {
  py::dict d;
  d["job_id"] = s.job_id;
  d["state"] = absl::AsciiStrToLower(client::FillStateName(s.state));
  d["gpu"] = s.gpu;
  d["steps_done"] = s.steps_done;
  d["steps_total"] = s.steps_total;
  d["bubbles"] = s.bubbles;
  d["predicted_remaining_s"] = ToSeconds(s.predicted_remaining);
  d["meets_deadline"] = s.meets_deadline;
  d["error"] = StatusOrNone(s.error);
  return d;
}

py::tuple SliceTuple(const proto::ByteSlice& slice) {
  return py::make_tuple(slice.region, slice.offset, slice.length);
}

py::dict AreaResultDict(client::AreaResult r) {
  py::dict d;
  d["task_id"] = r.task_id;
  py::list outputs;
  for (client::AreaTensor& t : r.outputs) {
    std::string name = t.name();
    outputs.append(py::make_tuple(name, AreaToNumpy(std::move(t))));
  }
  d["outputs"] = outputs;
  py::list sent;
  for (const proto::HostTensor& t : r.sent_inputs) {
    sent.append(py::make_tuple(t.name, SliceTuple(t.slice)));
  }
  d["sent_inputs"] = sent;
  d["latency_s"] = ToSeconds(r.latency);
  d["switch_time_s"] = ToSeconds(r.switch_time);
  return d;
}

py::dict TaskResultDict(client::TaskResult r) {
  py::dict d;
  d["task_id"] = r.task_id;
  py::list outputs;
  for (proto::HostTensor& t : r.outputs) {
    std::string name = t.name;
    outputs.append(py::make_tuple(name, ToNumpy(std::move(t))));
  }
  d["outputs"] = outputs;
  d["sent_inputs"] = py::list();
  d["latency_s"] = ToSeconds(r.latency);
  d["switch_time_s"] = ToSeconds(r.switch_time);
  return d;
}

client::FillJobOptions FillOptions(const py::dict& o) {
  client::FillJobOptions f;
  const std::string kind = o["kind"].cast<std::string>();
  if (kind == "training") {
    f.kind = client::FillKind::kTraining;
  } else if (kind == "inference") {
    f.kind = client::FillKind::kInference;
  } else if (kind == "synthetic") {
    f.kind = client::FillKind::kSynthetic;
  } else {
    throw py::value_error(absl::StrCat("kind must be 'training', 'inference' or 'synthetic', not '",
                                       kind, "'"));
  }
  f.model = o["model"].cast<std::string>();
  f.dataset_path = o["dataset"].cast<std::string>();
  f.output_path = o["output"].cast<std::string>();
  f.batch = o["batch"].cast<uint32_t>();
  f.steps = o["steps"].cast<uint32_t>();
  f.seed = o["seed"].cast<uint64_t>();
  f.step = Seconds(o["step_s"].cast<double>());
  f.memory_bytes = o["memory_bytes"].cast<uint64_t>();
  f.deadline = Seconds(o["deadline_s"].cast<double>());
  f.synthetic_step = Seconds(o["synthetic_step_s"].cast<double>());
  f.synthetic_alloc_bytes = o["synthetic_alloc_bytes"].cast<uint64_t>();
  return f;
}

// Owns the C++ client; closing (or collecting) it fails calls still in flight with Unavailable.
class PyClient {
 public:
  PyClient(const std::string& address, const std::string& token, double timeout_s,
           const std::string& transport, uint64_t area_bytes, uint64_t max_area_bytes) {
    client::ClientOptions options;
    options.token = token;
    options.timeout = Seconds(timeout_s);
    if (area_bytes > 0) options.areas.first_area_bytes = area_bytes;
    if (max_area_bytes > 0) options.areas.max_total_bytes = max_area_bytes;
    if (transport == "tcp") {
      options.transport = client::Transport::kTcp;
    } else if (transport != "auto") {
      throw py::value_error(
          absl::StrCat("transport must be 'auto' or 'tcp', not '", transport, "'"));
    }
    absl::StatusOr<std::unique_ptr<client::Client>> connected;
    {
      py::gil_scoped_release release;
      connected = client::Client::Connect(address, options);
    }
    client_ = Check(std::move(connected));
  }
  ~PyClient() { Close(); }

  void Close() {
    std::unique_ptr<client::Client> closing = std::move(client_);
    py::gil_scoped_release release;  // its reader thread may still deliver a reply
    closing.reset();
  }

  py::dict Register(const std::string& name, const std::string& model, const std::string& archive,
                    const std::string& weights, uint32_t batch, const std::string& plan,
                    const std::vector<std::string>& trainers, const std::string& dtype,
                    py::object progress, py::object detail, bool pin_resident) {
    client::RegisterOptions options;
    // Called on the client's reader thread while this one waits without the GIL: it takes the
    // GIL for the call, and the first exception it raises is raised here once Register returns.
    std::optional<py::error_already_set> raised;
    if (!progress.is_none()) {
      options.on_phase = [&progress, &raised](const std::string& phase, absl::Duration took) {
        py::gil_scoped_acquire gil;
        if (raised) return;
        try {
          progress(phase, absl::ToDoubleSeconds(took));
        } catch (py::error_already_set& e) {
          raised.emplace(std::move(e));
        }
      };
    }
    if (!detail.is_none()) {
      options.on_phase_progress = [&detail, &raised](const std::string& phase,
                                                     absl::Duration so_far,
                                                     const std::string& text) {
        py::gil_scoped_acquire gil;
        if (raised) return;
        try {
          detail(phase, absl::ToDoubleSeconds(so_far), text);
        } catch (py::error_already_set& e) {
          raised.emplace(std::move(e));
        }
      };
    }
    options.trainers = trainers;
    options.name = name;
    options.zoo_model = model;
    options.archive_path = archive;
    options.weights_path = weights;
    options.batch_size = batch;
    options.plan = plan;
    options.dtype = dtype;
    options.pin_resident = pin_resident;
    absl::StatusOr<client::RegisteredModel> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.Register(options);
    }
    if (raised) throw std::move(*raised);
    client::RegisteredModel m = Check(std::move(r));
    py::dict d;
    d["name"] = m.name;
    d["layers"] = m.layers;
    d["groups"] = m.groups;
    d["param_bytes"] = m.param_bytes;
    py::list phases;
    for (const auto& [phase, took] : m.phases) {
      phases.append(py::make_tuple(phase, absl::ToDoubleSeconds(took)));
    }
    d["phases"] = phases;
    return d;
  }

  py::list Models() {
    absl::StatusOr<std::vector<client::ModelInfo>> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.ListModels();
    }
    py::list out;
    for (const client::ModelInfo& m : Check(std::move(r))) {
      py::dict d;
      d["name"] = m.name;
      d["architecture"] = m.zoo_model;
      d["param_bytes"] = m.param_bytes;
      const proto::DTypeInfo* dtype = proto::FindDType(m.output_dtype);
      d["output_dtype"] = m.output_shape.empty() || dtype == nullptr ? std::string()
                          : dtype->numpy != nullptr                  ? std::string(dtype->numpy)
                                                                     : std::string(dtype->name);
      d["output_shape"] = m.output_shape;
      d["resident_gpus"] = m.resident_gpus;
      out.append(d);
    }
    return out;
  }

  py::dict Infer(const std::string& model, const py::list& inputs, int priority, double deadline_s,
                 double online_slo_s) {
    client::Client& c = Get();  // raises (needs the GIL) when closed
    client::InferOptions options;
    options.priority = priority;
    options.deadline = Seconds(deadline_s);
    options.online_slo = Seconds(online_slo_s);
    if (c.local()) {
      std::vector<client::AreaTensor> tensors;
      absl::Status placed;
      for (const py::handle item : inputs) {
        auto pair = item.cast<py::tuple>();
        absl::StatusOr<client::AreaTensor> t =
            ToArea(c, pair[0].cast<std::string>(), pair[1].cast<py::array>());
        if (!t.ok()) {
          placed = t.status();
          break;
        }
        tensors.push_back(*std::move(t));
      }
      if (placed.ok()) {
        absl::StatusOr<client::AreaResult> r;
        {
          py::gil_scoped_release release;
          r = c.InferArea(model, std::move(tensors), options);
        }
        return AreaResultDict(Check(std::move(r)));
      }
      // No room in the areas for the inputs (held results, or pswitchd's bound on areas): the
      // tensors travel in the frame (the C++ Infer falls back the same way for its outputs).
      if (!absl::IsResourceExhausted(placed)) Raise(placed);
    }
    std::vector<proto::HostTensor> tensors;
    for (const py::handle item : inputs) {
      auto pair = item.cast<py::tuple>();
      tensors.push_back(FromNumpy(pair[0].cast<std::string>(), pair[1].cast<py::array>()));
    }
    absl::StatusOr<client::TaskResult> r;
    {
      py::gil_scoped_release release;
      r = c.Infer(model, std::move(tensors), options);
    }
    return TaskResultDict(Check(std::move(r)));
  }

  bool Local() { return Get().local(); }

  // A new area tensor of `shape` and numpy `dtype` as a numpy view (Unix socket only).
  py::array Tensor(const std::vector<int64_t>& shape, const py::dtype& dtype) {
    client::Client& c = Get();
    const proto::DTypeInfo& info = NumpyDType("tensor", dtype);
    absl::StatusOr<client::AreaTensor> t;
    {
      py::gil_scoped_release release;  // may register another area: a round trip
      t = c.Tensor(shape, info.wire);
    }
    return AreaToNumpy(Check(std::move(t)));
  }

  // (area, offset, length) of the live area span `array` views, or None: what infer would send
  // for it without a copy.
  py::object AreaSlice(const py::array& array) {
    client::Client& c = Get();
    if (!c.local() || (array.flags() & py::array::c_style) == 0 || array.nbytes() == 0) {
      return py::none();
    }
    const uint64_t bytes = static_cast<uint64_t>(array.nbytes());
    std::shared_ptr<client::AreaSpan> span = c.areas()->Find(array.data(), bytes);
    if (span == nullptr) return py::none();
    const uint64_t offset =
        static_cast<uint64_t>(static_cast<const uint8_t*>(array.data()) - span->data());
    return SliceTuple(span->Slice(offset, bytes));
  }

  // The allocator's figures: areas, their bytes, and the bytes live spans hold.
  py::dict AreaStats() {
    client::Client& c = Get();
    py::dict d;
    client::AreaAllocator* areas = c.areas();
    d["areas"] = areas != nullptr ? areas->area_count() : 0u;
    d["area_bytes"] = areas != nullptr ? areas->area_bytes() : 0u;
    d["allocated_bytes"] = areas != nullptr ? areas->allocated_bytes() : 0u;
    return d;
  }

  py::dict Train(const std::string& model, uint32_t iterations, uint64_t seed, int priority,
                 const std::string& optimizer, double lr, double momentum, uint32_t batch,
                 double deadline_s, const std::string& as_model) {
    client::TrainOptions options;
    options.iterations = iterations;
    options.seed = seed;
    options.priority = priority;
    if (optimizer == "sgd") {
      options.optimizer = client::Optimizer::kSgd;
    } else if (optimizer == "adam") {
      options.optimizer = client::Optimizer::kAdam;
    } else {
      throw py::value_error(absl::StrCat("optimizer must be 'sgd' or 'adam', not '", optimizer,
                                         "'"));
    }
    options.learning_rate = lr;
    options.momentum = momentum;
    options.batch = batch;
    options.deadline = Seconds(deadline_s);
    options.as_model = as_model;
    absl::StatusOr<client::TaskResult> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.Train(model, options);
    }
    return TaskResultDict(Check(std::move(r)));
  }

  py::dict Status(uint64_t task_id) {
    absl::StatusOr<client::TaskStatus> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.Status(task_id);
    }
    return TaskStatusDict(Check(std::move(r)));
  }

  py::list ListTasks(uint32_t limit) {
    absl::StatusOr<std::vector<client::TaskStatus>> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.ListTasks(limit);
    }
    py::list out;
    for (const client::TaskStatus& s : Check(std::move(r))) out.append(TaskStatusDict(s));
    return out;
  }

  void Cancel(uint64_t task_id) { Call([&](client::Client& c) { return c.Cancel(task_id); }); }
  void Unload(const std::string& name) { Call([&](client::Client& c) { return c.Unload(name); }); }
  void BubbleBegin(uint32_t gpu, double expected_s, uint64_t free_bytes, int64_t began_ns) {
    Call([&](client::Client& c) { return c.BubbleBegin(gpu, Seconds(expected_s), free_bytes, began_ns); });
  }
  void BubbleEnd(uint32_t gpu) { Call([&](client::Client& c) { return c.BubbleEnd(gpu); }); }
  void RegisterBubbleCycle(uint32_t gpu, const std::string& json, int64_t origin_ns) {
    Call([&](client::Client& c) { return c.RegisterBubbleCycle(gpu, json, origin_ns); });
  }
  void CancelFill(uint64_t job) { Call([&](client::Client& c) { return c.CancelFill(job); }); }

  py::dict SubmitFill(const py::dict& options, bool estimate) {
    client::FillJobOptions o = FillOptions(options);
    absl::StatusOr<client::FillJobStatus> r;
    client::Client& c = Get();
    {
      py::gil_scoped_release release;
      r = estimate ? c.EstimateFill(o) : c.SubmitFill(o);
    }
    return FillStatusDict(Check(std::move(r)));
  }

  py::dict FillStatus(uint64_t job) {
    absl::StatusOr<client::FillJobStatus> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.FillStatus(job);
    }
    return FillStatusDict(Check(std::move(r)));
  }

  py::dict FillStats() {
    absl::StatusOr<client::FillServerStats> r;
    client::Client& c = Get();  // raises (needs the GIL) when closed
    {
      py::gil_scoped_release release;
      r = c.FillStats();
    }
    client::FillServerStats s = Check(std::move(r));
    py::dict d;
    d["bubbles"] = s.bubbles;
    d["bubble_time_s"] = ToSeconds(s.bubble_time);
    d["fill_step_time_s"] = ToSeconds(s.fill_step_time);
    d["steps"] = s.steps;
    d["pause_p50_s"] = ToSeconds(s.pause_p50);
    d["pause_p99_s"] = ToSeconds(s.pause_p99);
    d["killed"] = s.killed;
    d["runs"] = s.runs;
    d["bell_wakes"] = s.bell_wakes;
    return d;
  }

 private:
  client::Client& Get() {
    if (client_ == nullptr) Raise(absl::FailedPreconditionError("the client is closed"));
    return *client_;
  }
  template <typename Fn>
  void Call(Fn fn) {
    client::Client& c = Get();
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = fn(c);
    }
    Check(status);
  }

  std::unique_ptr<client::Client> client_;
};

}  // namespace
}  // namespace pswitch::python

PYBIND11_MODULE(_pswitch, m) {
  using pswitch::python::PyClient;
  m.doc() = "pswitch's C++ client library; use pswitch.Client";
  py::class_<PyClient>(m, "Client")
      .def(py::init<const std::string&, const std::string&, double, const std::string&, uint64_t,
                    uint64_t>(),
           py::arg("address"), py::arg("token"), py::arg("timeout_s"), py::arg("transport"),
           py::arg("area_bytes"), py::arg("max_area_bytes"))
      .def("local", &PyClient::Local)
      .def("tensor", &PyClient::Tensor)
      .def("area_slice", &PyClient::AreaSlice)
      .def("area_stats", &PyClient::AreaStats)
      .def("close", &PyClient::Close)
      .def("register", &PyClient::Register)
      .def("models", &PyClient::Models)
      .def("infer", &PyClient::Infer)
      .def("train", &PyClient::Train)
      .def("status", &PyClient::Status)
      .def("list_tasks", &PyClient::ListTasks)
      .def("cancel", &PyClient::Cancel)
      .def("unload", &PyClient::Unload)
      .def("bubble_begin", &PyClient::BubbleBegin)
      .def("bubble_end", &PyClient::BubbleEnd)
      .def("register_bubble_cycle", &PyClient::RegisterBubbleCycle)
      .def("submit_fill", &PyClient::SubmitFill)
      .def("fill_status", &PyClient::FillStatus)
      .def("cancel_fill", &PyClient::CancelFill)
      .def("fill_stats", &PyClient::FillStats);
}
