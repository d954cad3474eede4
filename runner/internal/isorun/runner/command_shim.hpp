#pragma once
/// @file command_shim.hpp
/// What the `-- CMD` shim and the supervisor agree on (command.hpp). The shim is a small program
/// of its own (runner/shim/command_shim.cpp, next to libisorun.so as `isorun-command-shim`),
/// linked statically against the C library alone, so that a command's start costs one small exec
/// more than the command itself (no dynamic loading), not a second load of isorun.
///
/// It is started with the program's path and arguments, descriptor 3 a SOCK_SEQPACKET socket to
/// the supervisor, and the program's environment. It runs the program in its own process group
/// (the supervisor made it a group leader), with `ISORUN_CAP_PRELOAD` turned into LD_PRELOAD for
/// the program only, ignores the signals meant for the program, kills the group if the
/// supervisor's end of the socket closes, and sends one `command_shim_report` when the program
/// has ended.

#include <cstdint>

namespace isorun::runner {

/// The shim's file name, next to libisorun.so.
inline constexpr const char* command_shim_name = "isorun-command-shim";

/// The program's end, as the shim saw it (one message on descriptor 3).
struct command_shim_report {
  std::int32_t code;    ///< exit code; 127 not found, 126 not executable
  std::int32_t signal;  ///< the signal that killed it, 0 if none
};

}  // namespace isorun::runner
