// --check inside a Session (run.h): the reference's inputs in fp64, the rows it checks and the
// reference and same-dtype baseline at those rows, per mode, computed at the first check and kept
// for every later kernel checked against the same inputs.
#pragma once

#include <map>
#include <vector>

#include "flashattn/registry.h"
#include "validate.h"

namespace flashattn {

struct RunInputs;
struct SessionOptions;

class CheckCache {
 public:
  // A kernel's outputs in mode `m` against the reference. `in` holds the host inputs (the
  // session downloads generated ones first), the same inputs at every call.
  CheckResult check(const KernelOutputs& out, Mode m, const RunInputs& in, const SessionOptions& opt);

 private:
  RefInputs ref_inputs(bool backward, const RunInputs& in, const SessionOptions& opt);
  const RowSelection& rows_for(Mode m, const RunInputs& in, const SessionOptions& opt);
  const ReferenceRows& reference_for(Mode m, const RunInputs& in, const SessionOptions& opt);
  const OutputErrors& baseline_for(Mode m, const RunInputs& in, const SessionOptions& opt);

  std::vector<double> ref_q, ref_k, ref_v, ref_do;  // the inputs in fp64, [B, H, S, D]
  std::map<int, RowSelection> selection;
  std::map<int, ReferenceRows> reference;
  std::map<int, OutputErrors> baseline;  // the same-dtype baseline's errors per mode
};

}  // namespace flashattn
