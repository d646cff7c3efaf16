#include "models/weight_init.h"

namespace pswitch::models {
namespace {

thread_local bool skip_init = false;

}  // namespace

SkipWeightInit::SkipWeightInit() : previous_(skip_init) { skip_init = true; }
SkipWeightInit::~SkipWeightInit() { skip_init = previous_; }

bool InitWeights() { return !skip_init; }

}  // namespace pswitch::models
