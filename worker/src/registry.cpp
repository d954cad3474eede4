#include <cxxabi.h>

#include <cstdlib>
#include <stdexcept>

#include "isorun/worker/task.hpp"

namespace isorun::worker {

// Out of line: the class's type information lives in libisorun alone, where the worker catches it.
named_error::~named_error() = default;

namespace {

// Drops ", std::allocator<...>"-style default arguments that make signatures unreadable.
void erase_template_arg(std::string& s, const std::string& prefix) {
  for (std::size_t at; (at = s.find(prefix)) != std::string::npos;) {
    std::size_t i = at + prefix.size();
    int depth = 1;
    while (i < s.size() && depth > 0) {
      if (s[i] == '<') ++depth;
      else if (s[i] == '>') --depth;
      ++i;
    }
    while (i < s.size() && s[i] == ' ' && at > 0 && s[at - 1] != ' ') ++i;
    s.erase(at, i - at);
  }
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size())
    s.replace(at, from.size(), to);
}

}  // namespace

registry& registry::instance() {
  static registry r;
  return r;
}

void registry::add(task_info info) {
  for (auto& t : tasks_) {
    if (t->name != info.name) continue;
    if (t->function == info.function) return;  // the same library loaded twice
    throw std::logic_error("isorun: two different functions are registered as task '" + info.name +
                           "'; use ISORUN_TASK_AS(fn, \"other_name\") for one of them");
  }
  tasks_.push_back(std::make_unique<task_info>(std::move(info)));
}

const task_info* registry::find(std::string_view name) const {
  for (const auto& t : tasks_)
    if (t->name == name) return t.get();
  return nullptr;
}

const task_info* registry::find_function(const void* fn) const {
  for (const auto& t : tasks_)
    if (t->function == fn) return t.get();
  return nullptr;
}

std::vector<const task_info*> registry::all() const {
  std::vector<const task_info*> out;
  for (const auto& t : tasks_) out.push_back(t.get());
  return out;
}

std::string readable_type_name(const std::type_info& type) {
  int status = 0;
  char* raw = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string s = status == 0 && raw ? raw : type.name();
  std::free(raw);
  replace_all(s, "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >", "std::string");
  replace_all(s, "std::__cxx11::", "std::");
  replace_all(s, "(anonymous namespace)::", "");
  erase_template_arg(s, ", std::allocator<");
  erase_template_arg(s, ", std::less<");
  erase_template_arg(s, ", std::char_traits<");
  replace_all(s, "> >", ">>");
  return s;
}

const char* arg_key(std::size_t index) {
  static const char* keys[max_task_args] = {"arg0", "arg1", "arg2", "arg3", "arg4", "arg5", "arg6", "arg7"};
  return keys[index];
}

namespace detail {
void write_text_result(result_sink& sink, const std::string& text) {
  std::byte* dst = sink.reserve(text.size(), nullptr);
  std::memcpy(dst, text.data(), text.size());
  sink.commit(text.size(), serialization::checksum({dst, text.size()}), serialization::encoding::json);
}
}  // namespace detail

}  // namespace isorun::worker
