// isorun._core: the C++ runner inside a Python process. Both sides of a call go through here:
//
//  - in the caller, start() turns a pickled call and its options into a runner::job whose worker
//    is a fresh Python interpreter (exec'd, never forked), and job.wait() hands back the outcome
//    and the validated result payload as a read-only buffer over the mapped result segment;
//  - in that interpreter (python -m isorun._worker), serve() runs the C++ worker protocol, whose
//    one task, "isorun.python", calls back into Python to run the function and then writes the
//    pickled result and its out-of-band buffers straight into the result segment.
//
// The request is the pickled call behind a small frame of variables the worker sets before the
// call runs (framed_request: the cap region of a capped call, which a standby interpreter cannot
// get at exec).
//
// The payload is this module's own format (payload.hpp): the runner validates its checksum and
#include "module.hpp"

#include <exception>

#include "isorun/runner/errors.hpp"

namespace nb = nanobind;

namespace {

// Raises the isorun.errors class `name` with `message` (the Python module owns the hierarchy).
void raise_python(const char* name, const char* message) {
  nb::object cls = nb::module_::import_("isorun.errors").attr(name);
  PyErr_SetString(cls.ptr(), message);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "isorun's C++ runner inside Python: isolated calls (caller) and the worker protocol (worker).";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const isorun::usage_error& e) {
      raise_python("UsageError", e.what());
    } catch (const isorun::internal_error& e) {
      raise_python("InternalError", e.what());
    }
  });
  isorun_python::bind_caller(m);
  isorun_python::bind_worker(m);
  isorun_python::bind_zygote(m);
}
