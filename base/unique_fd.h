// RAII owner of a POSIX file descriptor.
#ifndef PSWITCH_BASE_UNIQUE_FD_H_
#define PSWITCH_BASE_UNIQUE_FD_H_

namespace pswitch {

// Owns one file descriptor and closes it exactly once. Movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int Release();
  // Closes the current fd (if any) and takes `fd`.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

}  // namespace pswitch

#endif  // PSWITCH_BASE_UNIQUE_FD_H_
