#pragma once
/// @file export.hpp
/// What libisorun.so exports. The library is built with -fvisibility=hidden and
/// -fvisibility-inlines-hidden: a symbol leaves it only when its declaration says so.
///
/// ISORUN_API marks the public API (the headers installed under include/isorun): the free
/// functions defined in the library, and whole classes where the class is used from outside it
/// (out-of-line members, a vtable, or a type thrown or caught across the boundary: every
/// exception type must carry it, or a catch in a program or task library can miss it). Class
/// templates and inline functions defined in these headers need nothing: they are instantiated
/// where they are used.
///
/// The allocator, below serialization and a library of its own, has its own macro for the same
/// purpose: ISORUN_ALLOC_API (isorun/alloc/export.hpp).
///
/// isorun is built for ELF platforms, where importing needs no attribute: the macro reads the
/// same inside the library and in its users, in the manner of reproc's export.h without the
/// __declspec half.

#define ISORUN_API __attribute__((visibility("default")))
