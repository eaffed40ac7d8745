// operation.h — an out-of-memory that says where: the operation that ran out of host memory, and
// whether the input's size caused it.
//
// A std::bad_alloc says nothing of where it came from. with_memory_named(op, f) runs f and turns a
// bad_alloc escaping it into
//   - InputError(op.file, op.where, "sizes that this process's memory holds: <what> ran out of
//     host memory (<the limit>)") when op.file is set: the sizes came from that input (exit 2);
//   - OutOfMemory("out of host memory while <what> (<the limit>)") otherwise (exit 1).
// Nested calls name the innermost operation (the outer ones see the converted exception).
// The test hook STRATA_TEST_OUT_OF_MEMORY=TEXT makes the first operation whose `what` contains TEXT
// fail as if its allocation had (docs/testing.md).
//
// Thread-safety: with_memory_named is reentrant; the hook is read once.
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

namespace strata {

struct Operation {
  std::string what;   // "building the model", in words that follow "while"
  std::string file;   // the input whose sizes it follows ("" when none: a failure, not bad input)
  std::string where;  // the key or flag in it ("model", "--max-new-tokens"), or ""
};

class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws what with_memory_named turns a bad_alloc into.
[[noreturn]] void out_of_memory(const Operation& op);

// The memory this process may hold, in words: "ulimit -v 1.5 GiB", "cgroup memory.max 4 GiB",
// or "this machine has 23.5 GiB".
std::string memory_limit_text();

// The address-space limit of this process (ulimit -v) and the memory.max of its cgroup (v2), in
// bytes; 0 when there is none.
int64_t address_space_limit_bytes();
int64_t cgroup_memory_limit_bytes();

// Whether the test hook names op (STRATA_TEST_OUT_OF_MEMORY).
bool test_out_of_memory(const Operation& op);

template <class F>
decltype(auto) with_memory_named(const Operation& op, F&& f) {
  try {
    if (test_out_of_memory(op)) throw std::bad_alloc();
    return f();
  } catch (const std::bad_alloc&) {
    out_of_memory(op);
  }
}

}  // namespace strata
