// The libtorch version being compiled against, for the few places where libtorch's C++ API
// differs between the versions pswitch builds with (Debian's 1.13 and pip's 2.x).
#ifndef PSWITCH_MODELS_TORCH_VERSION_H_
#define PSWITCH_MODELS_TORCH_VERSION_H_

#include <torch/version.h>

// True when compiling against libtorch major.minor or newer.
#define PSWITCH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||          \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#endif  // PSWITCH_MODELS_TORCH_VERSION_H_
