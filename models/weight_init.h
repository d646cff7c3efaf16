// Whether zoo models draw their initial weights. CreateModel seeds libtorch's generator and the
// models' constructors draw from it, so a registration's seeded random weights are reproducible.
// A worker builds a model only to bind its parameters to the weights region that registration
// filled, so it skips that draw (issue 28: a quarter of a ResNet-152's build, three workers at
// once): while a SkipWeightInit lives on a thread, InitWeights() is false there and the models'
// own initialisers leave their tensors as allocated (libtorch's module constructors still fill
// their defaults).
#ifndef PSWITCH_MODELS_WEIGHT_INIT_H_
#define PSWITCH_MODELS_WEIGHT_INIT_H_

namespace pswitch::models {

class SkipWeightInit {
 public:
  SkipWeightInit();
  ~SkipWeightInit();
  SkipWeightInit(const SkipWeightInit&) = delete;
  SkipWeightInit& operator=(const SkipWeightInit&) = delete;

 private:
  const bool previous_;
};

// False while a SkipWeightInit lives on this thread.
bool InitWeights();

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_WEIGHT_INIT_H_
