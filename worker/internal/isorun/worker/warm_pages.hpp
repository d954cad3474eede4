#pragma once
/// @file warm_pages.hpp
/// A forked worker's first touches of its code cost a page fault each: fork copies no page-table
/// entries of a file mapping (a library's code, its read-only data), so every page of them the
/// call runs through faults in again, though the zygote had it mapped and the page cache holds
/// it. A worker that waits for its call maps those pages ahead of it, while it is idle: the pages
/// the zygote had mapped when it began forking, and no others (a library's pages that nothing
/// touched are not read in, nor counted in the worker's RSS).

#include "isorun/internal_api.hpp"

namespace isorun::worker {

/// @brief Notes which pages of this process's file mappings are mapped now, for the workers it
///        forks from here on to map while they wait (a zygote calls it before it forks any).
///        `ISORUN_WARM_PAGES=0` turns it off, to compare.
ISORUN_INTERNAL_API void note_pages_to_warm();

/// @brief Returns once `fd` is readable (the call's assignment, or the end of the channel), or
///        once the pages note_pages_to_warm() noted in the process this one was forked from are
///        mapped here, whichever is first. It maps nothing until the wait has lasted a few
///        milliseconds (a call sent back to back never waits for it), then a slice at a time,
///        looking at `fd` between slices.
ISORUN_INTERNAL_API void warm_pages_while_waiting(int fd);

}  // namespace isorun::worker
