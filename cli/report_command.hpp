#pragma once
// `isorun report OUT` and `isorun status OUT`: a sweep's folder, read.

#include <memory>
#include <string>
#include <thread>

#include "isorun/sweep/report_server.hpp"
#include "options.hpp"

namespace isorun::cli {

/// @brief (Re)writes o.out/report.html; with --serve, serves it live until a signal instead.
/// @throws usage_error if o.out is not a sweep's folder. @return the exit code, 0.
int write_report(const cli_options& o);

/// The live report beside a sweep (isorun sweep --serve): listening from construction (made
/// before the sweep, so that a port in use stops it before its folder is made), served on a
/// thread of its own from start(), stopped (the pages told so) by destruction. Nothing without
/// --serve.
class served_report {
 public:
  explicit served_report(const serve_flags& flags);
  void start(const std::string& out);
  void stop();  ///< the pages told the sweep is over; the thread joined
  ~served_report();
  served_report(const served_report&) = delete;
  served_report& operator=(const served_report&) = delete;

 private:
  std::unique_ptr<sweep::report_server> server_;
  std::thread thread_;
};

/// @brief Prints a sweep's progress from its folder o.out (and squeue, for Slurm arrays).
/// @throws usage_error if o.out is not a sweep's folder. @return the exit code, 0.
int show_status(const cli_options& o);

}  // namespace isorun::cli
