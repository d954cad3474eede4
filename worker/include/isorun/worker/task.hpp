#pragma once
/// @file task.hpp
/// Registering plain functions as tasks.
///
///     result train(const params& p);
///     ISORUN_TASK(train);              // registered as "train"
///
/// A task is a function whose argument and result types are cereal-serializable (use
/// CEREAL_NVP in `serialize` so the CLI can address fields by name). The registry keeps, for
/// each task, an invoker for the binary wire format (C++ API) and one for JSON (CLI), plus its
/// signature for `isorun tasks`.

#include <cereal/archives/binary.hpp>
#include <cereal/archives/json.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/chrono.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "isorun/export.hpp"
#include "isorun/serialization/blob.hpp"
#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::worker {

/// @brief An error a task reports under a type name of its own: what an interpreter's exception
///        becomes in a task that runs another language's code (a Python sweep's function that
///        raised ValueError is the trial's `task_error` "ValueError: ...", not a C++ type's).
class ISORUN_API named_error : public std::runtime_error {
 public:
  named_error(std::string type_name, const std::string& message)
      : std::runtime_error(message), type_name_{std::move(type_name)} {}
  ~named_error() override;
  /// The name the error is reported under.
  [[nodiscard]] const std::string& type_name() const noexcept { return type_name_; }

 private:
  std::string type_name_;
};

/// Where a task's encoded result goes (the worker's result segment).
class ISORUN_API result_sink {
 public:
  virtual ~result_sink() = default;
  /// @brief Space for a payload of `size` bytes. @throws on failure (segment too large...).
  /// @param blob_bytes for a blob result, where its bytes are (nullptr otherwise): a blob the
  ///        sink placed where its payload goes is then encoded where it lies.
  virtual std::byte* reserve(std::uint64_t size, const std::byte* blob_bytes) = 0;
  /// @brief Publishes the payload written after reserve().
  virtual void commit(std::uint64_t size, std::uint64_t checksum, serialization::encoding enc) = 0;
  /// @brief Publishes a result whose payload was streamed already: a blob of `blob_size` bytes
  ///        (worker_context::device_result). @throws std::logic_error if no such stream happened.
  virtual void commit_streamed(std::uint64_t blob_size) = 0;
};

/// A registered task.
struct task_info {
  std::string name;
  std::vector<std::string> arg_types;
  std::string result_type;
  /// Where, in the task's binary payload, a large blob it returns begins: 8 for an
  /// `isorun::blob` (its length comes first), 0 when its results hold no such blob. With it, the
  /// worker maps the result segment ahead while the task runs and places the first large blob
  /// the task makes at that offset (blob_placement.hpp): returning it then costs a checksum, not
  /// a copy.
  std::uint64_t placed_blob_offset = 0;
  const void* function = nullptr;  ///< the function's address, to find it from isolated(fn)
  /// JSON of default-constructed arguments, `{"arg0": ...}`; empty if not default-constructible.
  std::function<std::string()> default_args_json;
  /// JSON of a default-constructed result, `{"result": ...}`: the result's shape (its field
  /// names and types), for checking a sweep's metric up front. Empty if not default-constructible.
  std::function<std::string()> default_result_json;
  /// Decodes JSON arguments into the task's types without running it, throwing what the worker
  /// would throw: lets the supervisor reject, say, 3000000000 for an `int` before starting.
  std::function<void(const std::string&)> check_json_args;
  /// Runs the task on binary arguments and encodes its result into the sink. Returns the result
  /// value itself, encoded already, for the worker to destroy once it has reported: freeing a
  /// large result is then not on the way back of an early hand-over.
  std::function<std::shared_ptr<void>(std::span<const std::byte>, std::shared_ptr<const void>, result_sink&)>
      run_binary;
  std::function<void(const std::string&, result_sink&)> run_json;
};

/// The process-wide task registry.
class ISORUN_API registry {
 public:
  static registry& instance();
  /// @brief Adds a task. @throws std::logic_error if the name is taken by another function.
  void add(task_info info);
  /// @return the task, or nullptr.
  [[nodiscard]] const task_info* find(std::string_view name) const;
  [[nodiscard]] const task_info* find_function(const void* fn) const;
  [[nodiscard]] std::vector<const task_info*> all() const;

 private:
  std::vector<std::unique_ptr<task_info>> tasks_;
};

/// @brief Readable type name: "std::vector<float>" rather than the mangled or allocator-laden form.
ISORUN_API std::string readable_type_name(const std::type_info& type);

/// @brief The JSON key of argument `index`: "arg0", "arg1", ...
ISORUN_API const char* arg_key(std::size_t index);

inline constexpr std::size_t max_task_args = 8;

namespace detail {

template <class T>
void write_binary_result(result_sink& sink, const T& value) {
  if constexpr (std::is_same_v<T, blob>)
    if (value.is_streamed()) return sink.commit_streamed(value.size());
  const std::uint64_t n = serialization::encoded_size(value);
  const std::byte* blob_bytes = nullptr;
  if constexpr (std::is_same_v<T, blob>) blob_bytes = value.data();
  std::byte* dst = sink.reserve(n, blob_bytes);
  const std::uint64_t sum = serialization::encode_into(dst, n, value);
  sink.commit(n, sum, serialization::encoding::binary);
}

ISORUN_API void write_text_result(result_sink& sink, const std::string& text);

template <class Tuple, std::size_t... I>
std::string args_to_json(const Tuple& args, std::index_sequence<I...>) {
  std::ostringstream os;
  {
    cereal::JSONOutputArchive ar(os, cereal::JSONOutputArchive::Options::NoIndent());
    (ar(cereal::make_nvp(arg_key(I), std::get<I>(args))), ...);
  }
  return os.str();
}

template <class Tuple, std::size_t... I>
void args_from_json(const std::string& json, Tuple& args, std::index_sequence<I...>) {
  std::istringstream is(json);
  cereal::JSONInputArchive ar(is);
  (ar(cereal::make_nvp(arg_key(I), std::get<I>(args))), ...);
}

template <class T>
std::string result_to_json(const T& value) {
  std::ostringstream os;
  {
    cereal::JSONOutputArchive ar(os, cereal::JSONOutputArchive::Options::NoIndent());
    ar(cereal::make_nvp("result", value));
  }
  return os.str();
}

}  // namespace detail

/// @brief Registers `fn` under `name`. Used through ISORUN_TASK.
template <class R, class... A>
bool register_task(const char* name, R (*fn)(A...)) {
  static_assert(sizeof...(A) <= max_task_args, "isorun tasks take at most 8 arguments");
  using args_t = std::tuple<std::decay_t<A>...>;
  using seq = std::index_sequence_for<A...>;
  task_info t;
  t.name = name;
  t.function = reinterpret_cast<const void*>(fn);
  t.arg_types = {readable_type_name(typeid(std::decay_t<A>))...};
  if constexpr (std::is_void_v<R>) t.result_type = "void";
  else t.result_type = readable_type_name(typeid(R));
  if constexpr (std::is_same_v<R, isorun::blob>) t.placed_blob_offset = sizeof(std::uint64_t);
  if constexpr (std::is_default_constructible_v<args_t>) {
    t.default_args_json = [] { return detail::args_to_json(args_t{}, seq{}); };
    t.check_json_args = [](const std::string& json) {
      args_t args;
      if constexpr (sizeof...(A) > 0) detail::args_from_json(json, args, seq{});
    };
  }
  if constexpr (!std::is_void_v<R> && std::is_default_constructible_v<R>)
    t.default_result_json = [] { return detail::result_to_json(R{}); };

  auto call = [fn](args_t& args) -> decltype(auto) {
    return std::apply([fn](auto&... a) -> R { return fn(a...); }, args);
  };
  t.run_binary = [call](std::span<const std::byte> payload, std::shared_ptr<const void> owner,
                        result_sink& sink) -> std::shared_ptr<void> {
    args_t args;
    if constexpr (sizeof...(A) > 0)
      std::apply([&](auto&... a) { serialization::decode(payload, std::move(owner), a...); }, args);
    if constexpr (std::is_void_v<R>) {
      call(args);
      detail::write_binary_result(sink, std::uint8_t{0});
      return nullptr;
    } else {
      std::shared_ptr<R> result(new R(call(args)));  // R itself, not moved: it need not be movable
      detail::write_binary_result(sink, *result);
      return result;
    }
  };
  t.run_json = [call](const std::string& json, result_sink& sink) {
    args_t args;
    if constexpr (sizeof...(A) > 0) detail::args_from_json(json, args, seq{});
    if constexpr (std::is_void_v<R>) {
      call(args);
      detail::write_text_result(sink, "{\"result\":null}");
    } else {
      detail::write_text_result(sink, detail::result_to_json(call(args)));
    }
  };
  registry::instance().add(std::move(t));
  return true;
}

}  // namespace isorun::worker

#define ISORUN_DETAIL_CAT2(a, b) a##b
#define ISORUN_DETAIL_CAT(a, b) ISORUN_DETAIL_CAT2(a, b)

/// Registers function `fn` as a task named after it (e.g. "train", "ns::train").
#define ISORUN_TASK(fn) ISORUN_TASK_AS(fn, #fn)

/// Registers function `fn` as a task named `name`.
#define ISORUN_TASK_AS(fn, name)                                                \
  [[maybe_unused]] static const bool ISORUN_DETAIL_CAT(isorun_task_registered_, \
                                                       __LINE__) = ::isorun::worker::register_task(name, &fn)
