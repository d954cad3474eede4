#pragma once
/// @file export.hpp
/// ISORUN_ALLOC_API: the allocator's types that must be one type in every DSO, whichever DSO
/// holds their code. The allocator is a static library, linked into libisorun.so and into every
/// program and task library that links isorun; libisorun is built with hidden visibility
/// (isorun/export.hpp). A task's allocation runs the allocator in the task library and the worker
/// in libisorun catches its out_of_memory; a program catches the out_of_memory that libisorun
/// rethrows. So the exception types and the backend interface (a vtable) carry default
/// visibility wherever they are compiled, and their typeinfo is the same on both sides.

#define ISORUN_ALLOC_API __attribute__((visibility("default")))
