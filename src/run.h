// The run loop: one Session holds the inputs (host, and on the device once uploaded), the stream,
// the cuBLAS handle, the L2 flusher and the reference cache; Session::run executes one registered
// kernel in one mode: validate (poisoned outputs, fp64 reference), then time, then report.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "device_info.h"
#include "flashattn/registry.h"
#include "problem.h"
#include "timing.h"
#include "validate.h"

namespace flashattn {

// Inputs in the compute dtype and the problem's layout (int32 seqlens_k, float32 mask).
struct RunInputs {
  Problem problem;
  HostArray q, k, v;
  std::optional<HostArray> dout;
  std::optional<HostArray> seqlens_k;
  std::optional<HostArray> mask;
  // Set for generated inputs (benchmark sweeps): Q, K, V and dO are N(0,1) from this seed
  // (device_fill.h), made on the device, with host copies downloaded once only when the
  // reference (--check) or a host kernel needs them; made on the host when there is no GPU.
  // q, k, v and dout above stay empty until then.
  std::optional<uint64_t> generate_seed;
};

// Inputs generated on the device from `seed` (RunInputs::generate_seed), no host arrays.
RunInputs generated_inputs(const Problem& problem, uint64_t seed);

// This process's place in a ring that spans processes (--ring-rank, --ring-size, --ring-id).
struct RingProcess {
  int rank = 0;
  int size = 0;  // 0: not part of such a ring
  std::string id_file;
};

struct SessionOptions {
  int device = -1;  // CUDA device index; -1: no GPU (only host kernels can run)
  // Two or more: GPU kernels run as a ring over these devices (ring.h), device = devices[0].
  std::vector<int> devices;
  // size > 1: GPU kernels run as one rank (on `device`) of a ring of processes (ring.h).
  RingProcess ring_process;
  TimingOptions timing;
  TimingOptions cpu_timing;  // for host kernels (fewer repetitions by default)
  bool check = false;
  bool deterministic = false;
  int cpu_threads = 0;
  uint64_t seed = 0;
  double check_budget_macs = 8e9;  // reference work per mode before rows are sampled
  // A ring's one-GPU runs: on every card of the ring (--ring-baseline each) or on the first alone.
  bool ring_baseline_each = true;
};

struct MemoryStats {
  size_t inputs_bytes = 0;     // tensors the kernel reads (device copies)
  size_t outputs_bytes = 0;    // O, or dQ/dK/dV
  size_t workspace_bytes = 0;  // scratch the kernel declared (+ the cuBLAS workspace if it uses cuBLAS)
  size_t extra_bytes = 0;      // memory beyond inputs and outputs: workspace (+ lse in forward)
  size_t peak_bytes = 0;       // inputs + outputs + extra, held at once during the run
  long long device_used_bytes = -1;  // cudaMemGetInfo growth since the session started (GPU only)
};

// What a run over several GPUs (a ring, ring.h) adds to its record.
struct RingRecord {
  int size = 0;                        // GPUs in the ring
  int rank = -1;                       // this process's rank where the ring spans processes
  std::vector<int> devices;            // the GPUs this process drove, in ring order
  std::vector<double> tflops_per_gpu;  // each GPU's blocks' FLOPs / the ring's median time
  // Backward: "fp32" where the kernel keeps the gradients in fp32 (KernelMode::fp32_gradients),
  // "partial" where the ring adds up 16-bit partials; empty for a forward.
  std::string gradients;
  // The own block ran beside the others on a second kernels' stream (ring_impl.h).
  bool side_stream = false;
  // ... and started once the first K/V shard had arrived (the backward under GQA; ring_impl.h).
  bool side_after_first_shard = false;
  // The forward's last block took the whole GPU, its kernel's own grid (two GPUs; ring_impl.h),
  bool last_block_alone = false;
  // ... and merged into the outputs in its kernel, with no merge pass after it (ring_impl.h).
  bool last_block_merges = false;
  // NCCL's transfers went between buffers registered with it (ring_impl.h).
  bool registered_buffers = false;
  // ... and, on two GPUs, by NCCL's copy engines, taking no SM from the blocks (ring_impl.h).
  bool copy_engine = false;
  // One GPU played every rank (`--devices 0,0`; the transfers copies on it): checks the ring's
  // steps; its times, throughputs and scaling efficiency are not a ring's.
  bool loopback = false;
  // The backward's lending: the rank whose other block left kv heads to the other GPU (-1: none)
  // and how many kv heads' worth (FLASHATTN_RING_LEND; ring_impl.h).
  int lend_rank = -1;
  double lend_kv_heads = 0;
  // ... chosen from the lag measured before the run (FLASHATTN_RING_LEND=auto), that lag in ms.
  bool lend_auto = false;
  double lend_lag_ms = 0;
  // One profiled repetition after the timed ones (events on every stream): its length, and per
  // GPU the time its compute stream waited for a transfer; the largest of those is the
  // communication the compute did not hide.
  double profiled_ms = 0;
  std::vector<double> waiting_ms;
  // Per GPU, from that repetition's start to the end of its last block: GPUs whose blocks take
  // different times (the causal steps' blocks have other shapes on each) wait for the slowest.
  std::vector<double> blocks_ms;
  // Per GPU, that repetition's blocks, each with the time its stream reached its kernel (its K/V
  // arrived, the buffers it writes free) and the time the kernel ended, in ms from the GPU's start:
  // two kernels on a GPU's two streams share its SMs, so a span is not the kernel's time alone.
  struct BlockSpan {
    int step = 0, src = 0;  // the ring step, and the rank whose K/V shard it used
    bool side = false;      // on the second kernels' stream
    bool lent = false;      // another rank's queries (lending: its lent heads against this GPU's K/V)
    bool causal = false;
    int q_rows = 0, k_rows = 0;
    double begin_ms = 0, end_ms = 0;
  };
  std::vector<std::vector<BlockSpan>> block_spans;
  double exposed_comm_ms = 0;
  double link_gbps = 0;  // the fastest transfer of that repetition (>= 1 MiB): bytes / its time
  // The same kernel on devices[0] alone, same inputs, timed the same way (-1: not run, and why).
  double one_gpu_median_ms = -1;
  // The mean SM clock during that run (the ring's own is in the record's timing): both GPUs of a
  // ring draw power at once, and a clock the ring lost to the cap is not the ring's to answer for.
  double one_gpu_clock_mean_mhz = -1;
  std::string one_gpu_skipped;
  double scaling_efficiency = -1;  // one_gpu_median / (N x ring median)
  // SessionOptions::ring_baseline_each: the kernel alone on each rank's card in turn (a card once,
  // whichever ranks it plays), timed the same way; the ring's first GPU is rank 0's. A card that
  // could not run it has median_ms -1 and the reason.
  struct CardTime {
    int rank = 0, device = 0;
    double median_ms = -1, clock_mean_mhz = -1;
    std::string skipped;
    CardTime(int rank_, int device_, double ms = -1, double mhz = -1)
        : rank(rank_), device(device_), median_ms(ms), clock_mean_mhz(mhz) {}
  };
  std::vector<CardTime> one_gpu_per_rank;
  // Against those cards' combined rate (ring_cards_efficiency, ring_plan.h): the same for cards
  // alike, and not tied to which card is listed first. -1 without every rank's time.
  double scaling_efficiency_cards = -1;
  // Whether the ring's outputs and the one-GPU run's are identical bit for bit.
  bool bitwise_vs_one_gpu = false;
  // With --check, every element of each output against the one-GPU run, held to twice the
  // check's tolerance for that output: relative L2 for fp32, else the largest difference beyond
  // one ulp of the output's dtype (metric "max_abs_beyond_1ulp"; ring_run.cpp says why).
  struct VsOneGpu {
    std::string name, metric;
    double max_abs = 0, rel_l2 = 0;  // the differences
    double beyond_ulp = 0;           // the largest |difference| - 1 ulp over the elements (0 if none beyond)
    double measured = 0, tolerance = 0;
    bool passed = true;
  };
  std::vector<VsOneGpu> vs_one_gpu;
  // The largest absolute difference over every output element (lse included); -1: not compared.
  double max_abs_vs_one_gpu() const {
    double worst = -1;
    for (const VsOneGpu& d : vs_one_gpu) worst = std::max(worst, d.max_abs);
    return worst;
  }
};

// What became of one (kernel, mode) of a run. The report and the JSON spell it status_name().
enum class RunStatus {
  Ok,
  Skipped,  // not run, with a reason: unsupported, no GPU, too little memory, refused input
  Failed,   // ran and threw, with the reason
};
const char* status_name(RunStatus s);  // "ok", "skipped", "failed"

struct RunRecord {
  std::string kernel;
  Mode mode = Mode::Forward;
  bool gpu = true;
  RunStatus status = RunStatus::Ok;
  bool ok() const { return status == RunStatus::Ok; }
  std::string reason;
  TimingStats timing;
  double flops = 0, bytes = 0;
  double tflops = 0, gbps = 0;
  double peak_fraction = -1;  // of the dtype's peak compute rate; -1 when unknown
  MemoryStats memory;
  CheckResult check;
  KernelOutputs outputs;
  int sm_clock_start_mhz = -1, sm_clock_end_mhz = -1;
  std::vector<std::string> notes;
  std::optional<RingRecord> ring;  // set for a run over several GPUs
  // The compute dtype of this run where a session mixes dtypes (--dtype auto); else the
  // problem's.
  std::optional<DType> dtype;
};

// What a problem asks of a kernel, in the terms kernels declare in the registry.
struct Requirements {
  DType dtype = DType::F32;
  int head_dim = 0;
  uint32_t features = 0;  // kFeat* bits
};

// "" when `entry` meets `need` on a device of compute capability `sm` (0: no GPU); else a one-line
// reason naming what is unsupported and what the kernel supports. Every workload's support
// question ends here (forward/backward below, decode in decode_run.h).
std::string why_unsupported(const KernelMode& entry, const Requirements& need, int sm);
// A forward/backward problem's requirements.
std::string why_unsupported(const KernelMode& entry, const Problem& p, int sm);

// NVTX range name of a run, e.g. "fa2 forward B4 H8 S4096 D64 bf16 causal".
std::string nvtx_name(const KernelMode& e, const Problem& p);

// Notes on how far to trust a timing: noise rule not met, SM clock throttled or not sampled.
void add_timing_notes(RunRecord& rec);

// Minimum bytes a mode must move: each input read once, each output written once.
double min_bytes_moved(const Problem& p, Mode mode, bool has_mask_input, bool has_seqlens);

class Session {
 public:
  Session(RunInputs inputs, SessionOptions opt);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs one kernel in one mode. Support is checked first (InputError if unsupported); GPU errors
  // propagate as RuntimeError.
  RunRecord run(const KernelMode& entry);

  const DeviceInfo* device() const;
  const RunInputs& inputs() const;
  const SessionOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashattn
