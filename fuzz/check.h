// What the fuzz targets share: a check that reports and aborts (libFuzzer then keeps the input
// as a crash), for properties the code under test promises beyond "does not crash".
#ifndef PSWITCH_FUZZ_CHECK_H_
#define PSWITCH_FUZZ_CHECK_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

// Aborts with `message` unless `condition` holds. Active in every build (unlike assert).
#define PSWITCH_FUZZ_CHECK(condition, message)                                              \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #condition, \
                   std::string(message).c_str());                                           \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace pswitch::fuzz {

// Folds bytes into a value the optimizer cannot drop, so a target really reads (and the
// sanitizers really check) every byte a server would read.
class ReadSink {
 public:
  void Bytes(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < size; ++i) hash_ = (hash_ ^ p[i]) * 1099511628211ull;
  }
  template <typename T>
  void Value(const T& value) {
    Bytes(&value, sizeof(value));
  }
  void Text(const std::string& text) { Bytes(text.data(), text.size()); }

  ~ReadSink() { sunk_ = hash_; }

 private:
  uint64_t hash_ = 1469598103934665603ull;
  static inline volatile uint64_t sunk_ = 0;
};

}  // namespace pswitch::fuzz

#endif  // PSWITCH_FUZZ_CHECK_H_
