#pragma once
/// @file internal_api.hpp
/// ISORUN_INTERNAL_API: what libisorun.so exports beyond its public API (isorun/export.hpp),
/// for its clients inside this tree only: the sweep library, the CLI, the Python extension, the
/// tests and the benchmarks reach these classes and functions of the internal/ headers. It is
/// defined here, in a header that is never installed, so that the installed headers carry
/// ISORUN_API alone. It needs nothing else, as the cap library and the command shim include the
/// worker protocol's header (protocol.hpp) without the rest of isorun.

#define ISORUN_INTERNAL_API __attribute__((visibility("default")))
