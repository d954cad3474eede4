// isorun._core, the worker's side: in an interpreter isorun launched (python -m isorun._worker),
// serve() runs the C++ worker protocol, whose one task, "isorun.python", calls back into Python
// to run the function and then writes the pickled result and its out-of-band buffers straight
// into the result segment (payload.hpp: the runner validates its checksum and bounds before the
// caller sees it).
// bounds before the caller sees it; the Python side then parses it bounds-checked.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/serialization/protocol.hpp"
#include "isorun/worker/init.hpp"
#include "isorun/worker/task.hpp"
#include "module.hpp"
#include "numpy_results.hpp"
#include "payload.hpp"

extern char** environ;

namespace nb = nanobind;
using namespace nb::literals;
using isorun_python::python_task;

namespace {

// The Python callables serve() was given: entry(request: bytes) -> (tag, pickle, buffers) for a
// pickled call, and json_entry(request: str) -> (ok, type name, text) for a sweep's trial (its
// JSON result, or what the function raised). Set once, before the worker protocol starts.
PyObject* python_entry = nullptr;
PyObject* python_json_entry = nullptr;

// A sweep's trial (sweep/src/trials/python_trials.hpp): the request names the function and its keyword
// arguments in JSON, and the result is the task's JSON result, {"result": {...}}.
void run_python_json(const std::string& request, isorun::worker::result_sink& sink) {
  bool ok = false;
  std::string type, text;
  {
    nb::gil_scoped_acquire locked;
    try {
      auto out = nb::cast<nb::tuple>(nb::borrow(python_json_entry)(nb::str(request.data(), request.size())));
      ok = nb::cast<bool>(out[0]);
      type = nb::cast<std::string>(out[1]);
      text = nb::cast<std::string>(out[2]);
    } catch (nb::python_error& e) {
      throw std::runtime_error(std::string("isorun worker: ") + e.what());
    }
  }
  // The function raised: the trial's task_error, under the exception's own type.
  if (!ok) throw isorun::worker::named_error(type, text);
  isorun::worker::detail::write_text_result(sink, text);
}

struct held_buffer {
  Py_buffer view{};
  bool held = false;
  ~held_buffer() {
    if (held) PyBuffer_Release(&view);
  }
};

// Pins the call's cap region in the preloaded cap library, where this worker has one, right after
// the call's variables are set and before any code of the call runs (cap_region.hpp): the
// function cannot move itself off the supervisor's ledger, and its children get the region.
void bind_cap() {
  using bind_t = int (*)();
  if (auto* bind = reinterpret_cast<bind_t>(::dlsym(RTLD_DEFAULT, isorun::preload::bind_symbol))) bind();
}

// The task "isorun.python": runs the call in Python and writes its payload into the segment.
// Everything the function does is in Python; anything that goes wrong here (the result cannot be
// written) is a C++ exception, which the worker reports as the task's error.
std::shared_ptr<void> run_python_task(std::span<const std::byte> args, std::shared_ptr<const void>,
                                      isorun::worker::result_sink& sink) {
  std::uint32_t tag = 0;
  std::vector<held_buffer> parts;  // [0]: the pickle; then the out-of-band buffers
  // The variables of the call first (framed_request): before anything of the call can read them.
  std::uint32_t n = 0;
  if (args.size() < sizeof n) throw std::invalid_argument("isorun worker: a request without its frame");
  std::memcpy(&n, args.data(), sizeof n);
  if (n > args.size() - sizeof n) throw std::invalid_argument("isorun worker: a request frame past its end");
  const std::string variables(reinterpret_cast<const char*>(args.data()) + sizeof n, n);
  args = args.subspan(sizeof n + n);
  for (std::size_t at = 0; at < variables.size();) {
    const std::size_t end = std::min(variables.find('\0', at), variables.size());
    const std::string entry = variables.substr(at, end - at);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && eq > 0) ::setenv(entry.substr(0, eq).c_str(), entry.c_str() + eq + 1, 1);
    at = end + 1;
  }
  bind_cap();
  {
    nb::gil_scoped_acquire locked;
    nb::object out;
    try {
      nb::bytes request(reinterpret_cast<const char*>(args.data()), args.size());
      out = nb::borrow(python_entry)(request);
    } catch (nb::python_error& e) {
      // The entry catches the function's exceptions itself: this is isorun's own failure.
      throw std::runtime_error(std::string("isorun worker: ") + e.what());
    }
    auto t = nb::cast<nb::tuple>(out);
    tag = nb::cast<std::uint32_t>(t[0]);
    auto buffers = nb::cast<nb::list>(t[2]);
    parts = std::vector<held_buffer>(1 + buffers.size());
    auto hold = [](held_buffer& h, nb::handle obj) {
      if (PyObject_GetBuffer(obj.ptr(), &h.view, PyBUF_C_CONTIGUOUS) != 0) throw nb::python_error();
      h.held = true;
    };
    hold(parts[0], t[1]);
    for (std::size_t i = 0; i < buffers.size(); ++i) hold(parts[1 + i], buffers[i]);
  }
  // Into the segment without the GIL: the buffers stay held until it is written.
  std::vector<Py_buffer> buffers;
  for (std::size_t i = 1; i < parts.size(); ++i) buffers.push_back(parts[i].view);
  isorun_python::write_payload(sink, tag, parts[0].view, buffers);
  {
    nb::gil_scoped_acquire locked;
    parts.clear();
  }
  return nullptr;
}

void register_python_task() {
  auto& registry = isorun::worker::registry::instance();
  if (registry.find(python_task)) return;
  isorun::worker::task_info info;
  info.name = python_task;
  info.arg_types = {"pickled call, or a sweep trial's JSON request"};
  info.result_type = "pickled value, or a sweep trial's JSON result";
  info.placed_blob_offset = isorun_python::placed_offset;
  info.run_binary = run_python_task;
  info.run_json = run_python_json;
  registry.add(std::move(info));
}

/// The environment's entries when serve() began (sorted by address), which os.environ agreed
/// with, and os.environ's mapping. setenv puts a new entry in place of a variable it changes (or
/// one that held the same text before) and unsetenv takes one out, so what the worker changed
/// since is the entries not among these, and the variables of these no longer set: compared by
/// address, not text, because the call's path runs cold after an idle wait, where every byte
/// looked at costs.
struct environment_snapshot {
  std::vector<const char*> entries;
  nb::object environ_data;  // os.environ._data (bytes -> bytes, shared with os.environb), where it is a dict
};

environment_snapshot& environment_at_serve() {
  static auto* at = new environment_snapshot;  // never destroyed: it holds a Python object
  return *at;
}

std::vector<const char*> environment_entries() {
  std::vector<const char*> entries;
  for (char** e = environ; e && *e; ++e) entries.push_back(*e);
  std::sort(entries.begin(), entries.end(), std::less<>());  // std::less: a total order of addresses
  return entries;
}

/// With the GIL held.
void snapshot_environment() {
  auto& at = environment_at_serve();
  at.entries = environment_entries();
  nb::object data = nb::getattr(nb::module_::import_("os").attr("environ"), "_data", nb::none());
  at.environ_data = PyDict_Check(data.ptr()) ? data : nb::none();
}

/// Brings os.environ up to date with what the worker changed with setenv and unsetenv since
/// serve() began (the assignment's GPUs and cap, the call's variables, its own variables removed).
/// Written into os.environ's mapping itself: the C environment has them already, and os.environ's
/// own writes would set each again. (Through os.environb where that mapping is not a dict.)
void sync_environ() {
  const auto& at = environment_at_serve();
  const std::vector<const char*> now = environment_entries();
  const bool direct = !at.environ_data.is_none();
  nb::object environb = direct ? nb::none() : nb::module_::import_("os").attr("environb");
  auto name_of = [](const char* entry) -> std::optional<std::string_view> {
    const char* eq = std::strchr(entry, '=');
    if (!eq || eq == entry) return std::nullopt;
    return std::string_view(entry, static_cast<std::size_t>(eq - entry));
  };
  for (const char* e : now) {
    if (std::binary_search(at.entries.begin(), at.entries.end(), e, std::less<>())) continue;
    const auto name = name_of(e);
    if (!name) continue;
    nb::bytes key(name->data(), name->size()), value(e + name->size() + 1);
    if (direct) {
      if (PyDict_SetItem(at.environ_data.ptr(), key.ptr(), value.ptr()) != 0) throw nb::python_error();
    } else {
      environb[key] = value;
    }
  }
  for (const char* e : at.entries) {
    if (std::binary_search(now.begin(), now.end(), e, std::less<>())) continue;
    const auto name = name_of(e);
    if (!name || ::getenv(std::string(*name).c_str())) continue;  // changed, not removed
    nb::bytes key(name->data(), name->size());
    if (direct) {
      if (PyDict_DelItem(at.environ_data.ptr(), key.ptr()) != 0) PyErr_Clear();  // not there: nothing to remove
    } else {
      environb.attr("pop")(key, nb::none());
    }
  }
}

/// Serves the assignment this interpreter was launched for, calling `entry` for the call, and
/// exits the process: never returns.
[[noreturn]] void serve(nb::callable entry, nb::callable json_entry) {
  if (!isorun::is_worker_process())
    throw isorun::usage_error("isorun._worker runs only as a worker that isorun launched");
  snapshot_environment();  // before the worker's own changes, which sync_environ() brings to os.environ
  ::unsetenv(isorun::serialization::env::worker.data());  // the function's own children are ordinary processes
  python_entry = entry.release().ptr();
  python_json_entry = json_entry.release().ptr();
  nb::gil_scoped_release unlocked;  // the protocol waits; the task takes the GIL back
  isorun::detail::run_worker();
}
}  // namespace

namespace isorun_python {

void bind_worker(nb::module_& m) {
  register_python_task();
  m.def("place_numpy_arrays", &isorun_python::place_numpy_arrays,
        "In a worker: NumPy's large arrays are made from now on where the result goes (False where NumPy is "
        "not imported or older than 1.22).");
  m.def("sync_environ", &sync_environ,
        "In a worker: os.environ brought up to date with what it set or removed in the C environment since "
        "serve() began.");
  m.def("bind_cap", &bind_cap, "Pins the call's cap region (a sweep trial's variables were just set).");
  m.def("serve", &serve, "entry"_a, "json_entry"_a,
        "The worker's main: serves its one call through `entry` (a pickled call) or `json_entry` (a sweep's "
        "trial); never returns.");
}

}  // namespace isorun_python
