// Registration's facts of a built model (models/model_facts.h), and their weights in the form
// the memdaemon's weight store takes. pswitchd makes them in a pswitch-worker child
// (`--inspect-name`, registry/inspection_child.h); library use and tests in their own process.
#ifndef PSWITCH_WORKER_MODEL_INSPECTION_H_
#define PSWITCH_WORKER_MODEL_INSPECTION_H_

#include <string>

#include "absl/status/statusor.h"
#include "memdaemon/weight_store.h"
#include "models/model_facts.h"
#include "models/zoo_model.h"

namespace pswitch::worker {

// `model`'s facts in eval mode: its layers and their weights (contiguous copies the result
// keeps alive), optimizer-slot size, trainability, and input and output from one forward pass
// of its example input at `example_batch` (the batch a profile is about to run: the pass is
// then its warm-up too).
absl::StatusOr<models::ModelFacts> InspectModel(models::ZooModel& model,
                                                uint32_t example_batch = 1);

// The weights of `facts` as model `name`; the spans point into `facts`, which must outlive it.
memdaemon::ModelBytes WeightsOf(const models::ModelFacts& facts, const std::string& name);

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_MODEL_INSPECTION_H_
