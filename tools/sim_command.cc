#include "tools/sim_command.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tools/exact_optimum.h"
#include "tools/keep_problem.h"
#include "tools/optimum.h"
#include "tools/schedule_time.h"
#include "tools/serving_optimum.h"
#include "tools/step_bound.h"

namespace stensor {
namespace {

constexpr char kUsage[] =
    "usage: stensor sim LOG --limit BYTES|N% [--policy lru|version|belady|oracle]\n"
    "                   [--prefetch on|off] [--bandwidth GB/s | --link H2D[,D2H]]\n"
    "                   [--kernel-us US]\n"
    "                   [--compare] [--granularity BYTES] [--rounds N]\n"
    "                   [--planned-evictions on|off] [--exact-seconds S]\n"
    "                   [--host-vmm on|off] [--pieces on|off] [--slabs auto|on|off]\n";

// Every flag with its meaning (docs/sim.md has the same table).
constexpr char kHelp[] =
    "\n"
    "Replays an access log (STENSOR_ACCESS_LOG) under a cap with the library's\n"
    "own policy code and prints what moved, a modelled stall, and the least any\n"
    "policy could move (the exact offline optimum, and a lower bound). docs/sim.md\n"
    "describes the output.\n"
    "\n"
    "  LOG                   the access log (JSON Lines, docs/access-log.md)\n"
    "  --limit BYTES|N%      the cap: bytes (33554432, 32MiB, 2G) or a percentage\n"
    "                        of the log's working set (required)\n"
    "  --policy P            lru, version, belady (default, as STENSOR_POLICY) or\n"
    "                        oracle (belady told each buffer's true next use)\n"
    "  --prefetch on|off     drive the prefetch planner (default on, as\n"
    "                        STENSOR_PREFETCH)\n"
    "  --planned-evictions on|off\n"
    "                        issue the planner's evictions too, as the library\n"
    "                        does (default on); off: fetches into free memory only\n"
    "  --host-vmm on|off     the device maps host memory (default on, as current\n"
    "                        GPUs): what does not fit under the cap is served\n"
    "                        from host memory, as the library does, and read\n"
    "                        over the link; off: it is out of memory\n"
    "  --pieces on|off       with --host-vmm on, hold an allocation larger than a\n"
    "                        granule as one-granule pieces, as the library does\n"
    "                        (default on); off: whole, for comparison\n"
    "  --slabs auto|on|off   with --host-vmm on, pack allocations below half a\n"
    "                        granule into swappable one-granule slabs, as the\n"
    "                        library does with STENSOR_SLABS (default auto, as\n"
    "                        the library: once those held outside slabs reach\n"
    "                        an eighth of the cap)\n"
    "  --bandwidth GB/s      host<->device bandwidth of the time model, each\n"
    "                        direction (default 16)\n"
    "  --link H2D[,D2H]      the same, each direction's own (GB/s, as\n"
    "                        FAKECUDA_LINK)\n"
    "  --kernel-us US        compute time of a launch in the time model (default\n"
    "                        100); a launch record's own compute_us wins\n"
    "  --compare             one table: every policy with prefetch off and on,\n"
    "                        oracle, the exact optimum and the bound\n"
    "  --exact-seconds S     time limit of the exact optimum, and of the one\n"
    "                        with serving (--host-vmm on), each (default 30\n"
    "                        with --compare, else 0: not computed)\n"
    "  --granularity BYTES   VMM granularity (default 2 MiB, a multiple of 4096)\n"
    "  --rounds N            Lagrangian rounds of the LP bound (default 8)\n"
    "  -h, --help            this help\n"
    "\n"
    "Exit status: 0; 1 when the log cannot be read; 2 for a bad flag or value.\n";

double MiB(double bytes) { return bytes / (1 << 20); }

absl::Status BadFlag(absl::string_view flag, absl::string_view value, absl::string_view forms) {
  return absl::InvalidArgumentError(
      absl::StrCat("stensor sim: ", flag, " '", value, "' is not valid; expected ", forms));
}

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  uint64_t unit = 1;
  for (const auto& [suffix, mult] :
       std::vector<std::pair<std::string, uint64_t>>{{"kib", 1ull << 10},
                                                     {"mib", 1ull << 20},
                                                     {"gib", 1ull << 30},
                                                     {"k", 1ull << 10},
                                                     {"m", 1ull << 20},
                                                     {"g", 1ull << 30}}) {
    if (s.size() > suffix.size() &&
        s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) {
      unit = mult;
      s.resize(s.size() - suffix.size());
      break;
    }
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(s, &value) || value > UINT64_MAX / unit) {
    return absl::InvalidArgumentError("not a byte count");
  }
  return value * unit;
}

}  // namespace

absl::StatusOr<uint64_t> ParseLimit(absl::string_view limit, uint64_t working_set) {
  constexpr char kForms[] = "a byte count (33554432, 32MiB, 2G) or a percentage (40%)";
  if (!limit.empty() && limit.back() == '%') {
    double percent = 0;
    if (!absl::SimpleAtod(limit.substr(0, limit.size() - 1), &percent) || !(percent > 0) ||
        percent > 1000) {
      return BadFlag("--limit", limit, kForms);
    }
    return static_cast<uint64_t>(std::floor(percent / 100.0 * static_cast<double>(working_set)));
  }
  absl::StatusOr<uint64_t> bytes = ParseBytes(limit);
  if (!bytes.ok() || *bytes == 0) return BadFlag("--limit", limit, kForms);
  return *bytes;
}

absl::StatusOr<SimFlags> ParseSimFlags(const std::vector<std::string>& args) {
  SimFlags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a.compare(0, 2, "--") != 0) {
      if (!flags.log.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("stensor sim: one log only ('", flags.log, "' and '", a, "')"));
      }
      flags.log = a;
      continue;
    }
    std::string name = a.substr(2), value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (name != "compare") {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("stensor sim: --", name, " needs a value"));
      }
      value = args[++i];
    }
    if (name == "compare") {
      flags.compare = true;
    } else if (name == "limit") {
      flags.limit = value;
    } else if (name == "policy") {
      if (value != "lru" && value != "version" && value != "belady" && value != "oracle") {
        return BadFlag("--policy", value, "lru, version, belady or oracle");
      }
      flags.policy = value;
    } else if (name == "prefetch") {
      if (value != "on" && value != "off") return BadFlag("--prefetch", value, "on or off");
      flags.prefetch = value == "on";
    } else if (name == "planned-evictions") {
      if (value != "on" && value != "off") {
        return BadFlag("--planned-evictions", value, "on or off");
      }
      flags.planned_evictions = value == "on";
    } else if (name == "pieces") {
      if (value != "on" && value != "off") return BadFlag("--pieces", value, "on or off");
      flags.pieces = value == "on";
    } else if (name == "slabs") {
      if (value != "on" && value != "off" && value != "auto") {
        return BadFlag("--slabs", value, "auto, on or off");
      }
      flags.slabs = value == "on"    ? SlabMode::kOn
                    : value == "off" ? SlabMode::kOff
                                     : SlabMode::kAuto;
    } else if (name == "host-vmm") {
      if (value != "on" && value != "off") return BadFlag("--host-vmm", value, "on or off");
      flags.host_vmm = value == "on";
    } else if (name == "bandwidth") {
      if (!absl::SimpleAtod(value, &flags.bandwidth_gbps) || !(flags.bandwidth_gbps > 0) ||
          !std::isfinite(flags.bandwidth_gbps)) {
        return BadFlag("--bandwidth", value, "a positive number of GB/s (each direction)");
      }
      flags.d2h_bandwidth_gbps = flags.bandwidth_gbps;
    } else if (name == "link") {
      // H2D[,D2H], as FAKECUDA_LINK.
      const std::vector<std::string> parts = absl::StrSplit(value, ',');
      double gbps[2] = {0, 0};
      bool ok = parts.size() <= 2;
      for (size_t i = 0; ok && i < parts.size(); ++i) {
        ok = absl::SimpleAtod(parts[i], &gbps[i]) && gbps[i] > 0 && std::isfinite(gbps[i]);
      }
      if (!ok) {
        return BadFlag("--link", value,
                       "H2D_GBps or H2D_GBps,D2H_GBps: positive GB/s, as FAKECUDA_LINK");
      }
      flags.bandwidth_gbps = gbps[0];
      flags.d2h_bandwidth_gbps = parts.size() == 2 ? gbps[1] : gbps[0];
    } else if (name == "kernel-us") {
      if (!absl::SimpleAtod(value, &flags.kernel_us) || !(flags.kernel_us >= 0) ||
          !std::isfinite(flags.kernel_us)) {
        return BadFlag("--kernel-us", value, "microseconds per launch, 0 or more");
      }
    } else if (name == "granularity") {
      absl::StatusOr<uint64_t> g = ParseBytes(value);
      if (!g.ok() || *g == 0 || *g % kPageBytes != 0) {
        return BadFlag("--granularity", value, "a positive multiple of 4096 bytes");
      }
      flags.granularity = *g;
    } else if (name == "exact-seconds") {
      if (!absl::SimpleAtoi(value, &flags.exact_seconds) || flags.exact_seconds < 0 ||
          flags.exact_seconds > 86400) {
        return BadFlag("--exact-seconds", value, "0 (LP bound only) to 86400 seconds");
      }
    } else if (name == "rounds") {
      if (!absl::SimpleAtoi(value, &flags.rounds) || flags.rounds < 1 || flags.rounds > 1000) {
        return BadFlag("--rounds", value, "1 to 1000");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("stensor sim: unknown flag --", name));
    }
  }
  if (flags.exact_seconds < 0) flags.exact_seconds = flags.compare ? 30 : 0;
  if (flags.log.empty()) return absl::InvalidArgumentError("stensor sim: no access log given");
  if (flags.limit.empty()) return absl::InvalidArgumentError("stensor sim: --limit is required");
  return flags;
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeSimPolicy(absl::string_view name) {
  if (name == "lru") return MakeLruPolicy();
  if (name == "version") return MakeVersionPolicy();
  // oracle: belady's rule on the workload's true next uses (ReplayOptions::oracle).
  if (name == "belady" || name == "oracle") return MakeBeladyPolicy();
  return absl::InvalidArgumentError(absl::StrCat("unknown policy '", name, "'"));
}

namespace {

struct Row {
  std::string policy;
  bool prefetch = false;
  absl::StatusOr<ReplayResult> result;
};

absl::StatusOr<ReplayResult> RunOne(const Workload& workload, const SimFlags& flags, uint64_t cap,
                                    absl::string_view policy_name, bool prefetch) {
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakeSimPolicy(policy_name);
  if (!policy.ok()) return policy.status();
  ReplayOptions options;
  options.cap = cap;
  options.policy = policy->get();
  options.version_rules = policy_name != "lru";
  options.bandwidth_gbps = flags.bandwidth_gbps;
  options.d2h_bandwidth_gbps = flags.d2h_bandwidth_gbps;
  options.kernel_us = flags.kernel_us;
  options.prefetch = prefetch;
  options.planned_evictions = flags.planned_evictions;
  options.host_vmm = flags.host_vmm;
  options.oracle = policy_name == "oracle";
  return Replay(workload, options);
}

void PrintResult(const ReplayResult& r, std::ostream& out) {
  out << absl::StrFormat("device->host        %12u bytes (%.1f MiB) in %u swap-outs\n", r.bytes_out,
                         MiB(r.bytes_out), r.swap_outs);
  out << absl::StrFormat("host->device        %12u bytes (%.1f MiB) in %u swap-ins on demand\n",
                         r.bytes_in, MiB(r.bytes_in), r.on_demand_swap_ins);
  out << absl::StrFormat("moved               %12u bytes (%.1f MiB)\n", r.bytes_moved(),
                         MiB(r.bytes_moved()));
  out << absl::StrFormat("clean drops         %12u (%.1f MiB, no copy)\n", r.clean_drops,
                         MiB(r.bytes_dropped));
  out << absl::StrFormat("never-written drops %12u (%.1f MiB, no copy)\n", r.never_written_drops,
                         MiB(r.bytes_never_written));
  out << absl::StrFormat("swap-ins, no copy   %12u (overwritten whole)\n", r.swap_ins_without_copy);
  out << absl::StrFormat("swap-ins, never written %8u (no copy)\n", r.swap_ins_never_written);
  out << absl::StrFormat("prefetches          %12u (%u evicted before use; %u planned evictions)\n",
                         r.prefetches, r.fetches_wasted, r.planned_evictions);
  out << absl::StrFormat("iteration           %12u operations (detected; 0: none)\n",
                         r.iteration_period);
  out << absl::StrFormat("reads from host     %12u\n", r.reads_served_from_host);
  out << absl::StrFormat(
      "served from host    %12u bytes (%.1f MiB) over the link in %u buffer uses (%u by choice: "
      "where their room would displace one needed no later or copy out a larger one nothing uses "
      "again or they would be forced out again before their next use, or, %u of them, pieces no "
      "pointer of a launch reached); %u buffers born in host "
      "memory (%.1f MiB)\n",
      r.bytes_served, MiB(r.bytes_served), r.served_from_host, r.served_by_choice, r.served_far,
      r.born_on_host, MiB(r.bytes_born_on_host));
  out << absl::StrFormat("peak resident       %12u bytes (%.1f MiB)\n", r.peak_resident,
                         MiB(r.peak_resident));
  out << absl::StrFormat("compute             %12.3f ms (modelled)\n", r.compute_us / 1e3);
  out << absl::StrFormat("stall               %12.3f ms (compute stream waiting for swaps)\n",
                         r.stall_us / 1e3);
  out << absl::StrFormat(
      "serving             %12.3f ms (operations reading served bytes over "
      "the link beyond their compute)\n",
      r.serve_us / 1e3);
  out << absl::StrFormat(
      "drained             %12.3f ms (the last operation done and every queued copy)\n",
      r.drained_us / 1e3);
}

// The exact optimum's schedule in the time model (tools/schedule_time.h),
// its problem built again (whole buffers, as the exact optimum's).
std::optional<ScheduleTime> TimeExact(const Workload& workload, const SimFlags& flags, uint64_t cap,
                                      const ExactOptimum& exact) {
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(workload, cap);
  if (!problem.ok() || exact.schedule.size() != problem->gaps.size()) return std::nullopt;
  ScheduleTimeOptions timing;
  timing.in_us_per_byte = 1 / (flags.bandwidth_gbps * 1e3);
  timing.out_us_per_byte = 1 / (flags.d2h_bandwidth_gbps * 1e3);
  return TimeSchedule(*problem, exact.schedule, ComputeTimes(workload, flags.kernel_us), timing);
}

// The time no schedule beats (tools/step_bound.h), and this run's against it.
void PrintStepBound(const absl::StatusOr<StepBound>& bound, const ReplayResult& r,
                    std::ostream& out) {
  if (!bound.ok()) {
    out << "time bound          not computed: " << bound.status().message() << "\n";
    return;
  }
  out << absl::StrFormat(
      "time bound          %12.3f ms at least, any schedule: compute %.3f ms, at least %.1f MiB "
      "in (%.3f ms), %.1f MiB out (%.3f ms), %.1f MiB both ways (%.3f ms), precedence %.3f ms\n",
      bound->us() / 1e3, bound->compute_us / 1e3, MiB(bound->bytes_in), bound->in_us / 1e3,
      MiB(bound->bytes_out), bound->out_us / 1e3, MiB(bound->bytes_moved), bound->moved_us / 1e3,
      bound->precedence_us / 1e3);
  if (bound->us() > 0) {
    out << absl::StrFormat("x time bound        %12.2f (this run, drained, against the bound)\n",
                           r.drained_us / bound->us());
  }
}

// The exact optimum's line: proven, a schedule found within the time limit,
// or why there is none.
void PrintExact(const std::optional<absl::StatusOr<ExactOptimum>>& exact, std::ostream& out) {
  if (!exact) return;
  if (!exact->ok()) {
    out << "exact: not computed: " << exact->status().message() << "\n";
    return;
  }
  const ExactOptimum& e = **exact;
  out << absl::StrFormat(
      "exact: %s %u bytes (%.1f MiB: %.1f device->host, %.1f host->device) in whole buffers "
      "(%s); %d of %d gaps kept\n",
      e.proven ? "the optimum moves" : "not proven within the time limit; a schedule moving",
      e.bytes_moved, MiB(e.bytes_moved), MiB(e.bytes_out), MiB(e.bytes_in),
      e.by_bound ? "the LP bound's own schedule, which moves the bound"
                 : absl::StrFormat("0-1 program, GLPK, %d rows", e.rows),
      e.kept_gaps, e.gaps);
}

// The optimum with serving's line: bytes copied each way and served, and
// how far it is proven.
void PrintServing(const std::optional<absl::StatusOr<ServingOptimum>>& serving, std::ostream& out) {
  if (!serving) return;
  if (!serving->ok()) {
    out << "serving: not computed: " << serving->status().message() << "\n";
    return;
  }
  const ServingOptimum& s = **serving;
  out << absl::StrFormat(
      "serving: %s %u bytes (%.1f MiB: %.1f device->host, %.1f host->device, %.1f served over "
      "the link in %d of %d uses)%s; 0-1 program, GLPK, %d rows\n",
      s.proven ? "the optimum with serving moves"
               : "not proven within the time limit; a schedule with serving moving",
      s.moved(), MiB(s.moved()), MiB(s.bytes_out), MiB(s.bytes_in), MiB(s.bytes_served),
      s.served_uses, s.uses,
      s.proven ? "" : absl::StrFormat(", no schedule below %.1f MiB", MiB(s.lower_bound)), s.rows);
}

// The offline optimum: the LP bound and, when asked for, the exact one,
// over one KeepProblem, freed before the replays; with --host-vmm on, the
// exact one with serving too (a schedule exists for any cap above the
// plain allocations, where the others may have none).
struct Optima {
  absl::StatusOr<OptimumBound> bound = absl::UnknownError("not computed");
  std::optional<absl::StatusOr<ExactOptimum>> exact;
  std::optional<absl::StatusOr<ServingOptimum>> serving;
};

Optima ComputeOptima(const Workload& workload, const SimFlags& flags, uint64_t cap) {
  Optima optima;
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(workload, cap);
  if (!problem.ok()) {
    optima.bound = problem.status();
    if (flags.exact_seconds > 0 && flags.host_vmm) {
      ServingOptions serving_options;
      serving_options.cap = cap;
      serving_options.time_limit_ms = flags.exact_seconds * 1000;
      optima.serving = ComputeServingOptimum(workload, serving_options);
    }
    return optima;
  }
  OptimumOptions optimum_options;
  optimum_options.cap = cap;
  optimum_options.rounds = flags.rounds;
  optima.bound = ComputeOptimumBound(*problem, optimum_options);
  if (flags.exact_seconds > 0 && optima.bound.ok()) {
    ExactOptions exact_options;
    exact_options.cap = cap;
    exact_options.time_limit_ms = flags.exact_seconds * 1000;
    exact_options.bound = &*optima.bound;
    optima.exact = ComputeExactOptimum(*problem, exact_options);
  }
  if (flags.exact_seconds > 0 && flags.host_vmm) {
    problem = absl::UnknownError("freed");  // the one with serving is larger
    ServingOptions serving_options;
    serving_options.cap = cap;
    serving_options.time_limit_ms = flags.exact_seconds * 1000;
    // The best whole-buffer schedule known to start from.
    if (optima.exact && optima.exact->ok()) {
      serving_options.whole_schedule = &(*optima.exact)->schedule;
    } else if (optima.bound.ok() && optima.bound->has_schedule) {
      serving_options.whole_schedule = &optima.bound->schedule;
    }
    optima.serving = ComputeServingOptimum(workload, serving_options);
  }
  return optima;
}

}  // namespace

int RunSim(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      out << kUsage << kHelp;
      return 0;
    }
  }
  absl::StatusOr<SimFlags> flags = ParseSimFlags(args);
  if (!flags.ok()) {
    err << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  absl::StatusOr<Workload> workload = ReadWorkload(flags->log, flags->granularity);
  if (!workload.ok()) {
    err << "stensor sim: " << workload.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<uint64_t> cap = ParseLimit(flags->limit, workload->working_set);
  if (!cap.ok()) {
    err << cap.status().message() << "\n" << kUsage;
    return 2;
  }
  // Where host memory can stand in at an address, the library holds an
  // allocation larger than a granule as pieces of one: so does the replay.
  size_t split = 0;
  if (flags->host_vmm && flags->pieces) *workload = SplitIntoPieces(*workload, *cap, &split);
  // And small ones packed into slabs, as STENSOR_SLABS says.
  size_t packed = 0;
  if (flags->host_vmm && flags->slabs != SlabMode::kOff) {
    std::optional<uint64_t> onset_cap;
    if (flags->slabs == SlabMode::kAuto) onset_cap = *cap;
    *workload = PackIntoSlabs(*workload, onset_cap, &packed);
  }
  out << absl::StrFormat(
      "log                 %s: %u operations, %u launches (%u of unknown accesses, %u naming "
      "none of their buffers)\n",
      flags->log, workload->ops.size(), workload->launches, workload->unknown_launches,
      workload->blind_launches);
  if (split > 0) {
    out << absl::StrFormat("pieces              %u allocations larger than a granule, in pieces\n",
                           split);
  }
  if (packed > 0) {
    out << absl::StrFormat("slabs               %u allocations below half a granule, in slabs\n",
                           packed);
  }
  out << absl::StrFormat("working set         %12u bytes (%.1f MiB, peak of live charges)\n",
                         workload->working_set, MiB(workload->working_set));
  out << absl::StrFormat("cap                 %12u bytes (%.1f MiB, %.1f%% of the working set)\n",
                         *cap, MiB(*cap),
                         workload->working_set ? 100.0 * *cap / workload->working_set : 0.0);
  if (flags->d2h_bandwidth_gbps == flags->bandwidth_gbps) {
    out << absl::StrFormat("time model          %.3g GB/s each direction, %.3g us per launch\n",
                           flags->bandwidth_gbps, flags->kernel_us);
  } else {
    out << absl::StrFormat(
        "time model          %.3g GB/s host->device, %.3g device->host, %.3g us per launch\n",
        flags->bandwidth_gbps, flags->d2h_bandwidth_gbps, flags->kernel_us);
  }
  Optima optima = ComputeOptima(*workload, *flags, *cap);
  const absl::StatusOr<OptimumBound>& optimum = optima.bound;
  const std::optional<absl::StatusOr<ExactOptimum>>& exact = optima.exact;
  // Ratios are to the exact optimum when it was proven, else to the bound.
  const bool exact_proven = exact && exact->ok() && (*exact)->proven;
  const uint64_t reference = exact_proven   ? (*exact)->bytes_moved
                             : optimum.ok() ? optimum->bytes_moved
                                            : 0;
  // With serving: moved and served bytes against its optimum when proven,
  // else its lower bound.
  const std::optional<absl::StatusOr<ServingOptimum>>& serving = optima.serving;
  const bool serving_ok = serving && serving->ok();
  const bool serving_proven = serving_ok && (*serving)->proven;
  const uint64_t serving_reference = !serving_ok      ? 0
                                     : serving_proven ? (*serving)->moved()
                                                      : (*serving)->lower_bound;
  auto serving_ratio = [&](const ReplayResult& r) -> std::string {
    if (!serving_ok) return "-";
    const uint64_t with = r.bytes_moved() + r.bytes_served;
    if (serving_reference == 0) return with == 0 ? "1.00" : "inf";
    return absl::StrFormat("%.2f", static_cast<double>(with) / serving_reference);
  };

  StepBoundOptions step;
  step.cap = *cap;
  step.bandwidth_gbps = flags->bandwidth_gbps;
  step.d2h_bandwidth_gbps = flags->d2h_bandwidth_gbps;
  step.kernel_us = flags->kernel_us;
  step.serving = flags->host_vmm;
  step.rounds = flags->rounds;
  if (!flags->host_vmm && optimum.ok()) step.both_ways = &*optimum;
  const absl::StatusOr<StepBound> time_bound = ComputeStepBound(*workload, step);

  if (!flags->compare) {
    absl::StatusOr<ReplayResult> r =
        RunOne(*workload, *flags, *cap, flags->policy, flags->prefetch);
    if (!r.ok()) {
      err << "stensor sim: " << r.status().message() << "\n";
      return 1;
    }
    out << absl::StrFormat("policy              %s, prefetch %s\n", flags->policy,
                           flags->prefetch ? "on" : "off");
    PrintResult(*r, out);
    if (optimum.ok()) {
      out << absl::StrFormat(
          "optimum             %12u bytes (%.1f MiB) at least: LP lower bound (fractional "
          "min-cost flow)\n",
          optimum->bytes_moved, MiB(optimum->bytes_moved));
    } else {
      out << "optimum             not computed: " << optimum.status().message() << "\n";
    }
    PrintExact(exact, out);
    if (reference > 0) {
      out << absl::StrFormat("x optimum           %12.2f (this run against the %s)\n",
                             static_cast<double>(r->bytes_moved()) / reference,
                             exact_proven ? "exact optimum" : "LP bound");
    }
    PrintServing(serving, out);
    if (serving_ok) {
      out << absl::StrFormat(
          "x serving optimum   %12s (this run's moved and served bytes against the %s)\n",
          serving_ratio(*r), serving_proven ? "optimum with serving" : "lower bound with serving");
    }
    PrintStepBound(time_bound, *r, out);
    return 0;
  }

  std::vector<Row> rows;
  for (const char* policy : {"lru", "version", "belady"}) {
    for (bool prefetch : {false, true}) {
      rows.push_back(Row{policy, prefetch, RunOne(*workload, *flags, *cap, policy, prefetch)});
    }
  }
  // What belady would move knowing the future: the part of the distance to
  // the optimum that is prediction.
  rows.push_back(Row{"oracle", false, RunOne(*workload, *flags, *cap, "oracle", false)});
  out << absl::StrFormat("\n%-8s %-8s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "policy",
                         "prefetch", "D2H MiB", "H2D MiB", "moved MiB", "x optimum", "stall ms",
                         "on-demand", "served MiB", "x serving", "x time");
  for (const Row& row : rows) {
    out << absl::StrFormat("%-8s %-8s ", row.policy, row.prefetch ? "on" : "off");
    if (!row.result.ok()) {
      out << row.result.status().message() << "\n";
      continue;
    }
    const ReplayResult& r = *row.result;
    std::string ratio = "-";
    if (reference > 0) {
      ratio = absl::StrFormat("%.2f", static_cast<double>(r.bytes_moved()) / reference);
    } else if (optimum.ok()) {
      ratio = r.bytes_moved() == 0 ? "1.00" : "inf";
    }
    const std::string time_ratio = time_bound.ok() && time_bound->us() > 0
                                       ? absl::StrFormat("%.2f", r.drained_us / time_bound->us())
                                       : "-";
    out << absl::StrFormat("%10.1f %10.1f %10.1f %10s %10.3f %10u %10.1f %10s %10s\n",
                           MiB(r.bytes_out), MiB(r.bytes_in), MiB(r.bytes_moved()), ratio,
                           r.stall_us / 1e3, r.on_demand_swap_ins, MiB(r.bytes_served),
                           serving_ratio(r), time_ratio);
  }
  std::optional<ScheduleTime> exact_time;
  if (exact_proven) {
    const ExactOptimum& e = **exact;
    exact_time = TimeExact(*workload, *flags, *cap, e);
    std::string time_ratio = "-", stall = "-", on_demand = "-";
    if (exact_time) {
      stall = absl::StrFormat("%.3f", exact_time->stall_us / 1e3);
      on_demand = absl::StrCat(exact_time->on_demand);
      if (time_bound.ok() && time_bound->us() > 0) {
        time_ratio = absl::StrFormat("%.2f", exact_time->drained_us / time_bound->us());
      }
    }
    out << absl::StrFormat("%-8s %-8s %10.1f %10.1f %10.1f %10s %10s %10s %10s %10s %10s\n",
                           "exact", "-", MiB(e.bytes_out), MiB(e.bytes_in), MiB(e.bytes_moved),
                           "1.00", stall, on_demand, "0.0", "-", time_ratio);
  }
  if (optimum.ok()) {
    out << absl::StrFormat(
        "%-8s %-8s %10.1f %10.1f %10.1f %10s %10s\n", "LP bound", "-", MiB(optimum->bytes_out),
        MiB(optimum->bytes_in), MiB(optimum->bytes_moved),
        reference > 0
            ? absl::StrFormat("%.2f", static_cast<double>(optimum->bytes_moved) / reference)
            : "-",
        "-");
    out << absl::StrFormat(
        "LP bound: a lower bound (LP relaxation by min-cost flow, fractional keeps): no policy "
        "under these swap rules moves fewer than %u bytes; %d gaps over %d points, %d rounds\n",
        optimum->bytes_moved, optimum->gaps, optimum->points, optimum->rounds);
  } else {
    out << "optimum  not computed: " << optimum.status().message() << "\n";
  }
  PrintExact(exact, out);
  if (exact_time) {
    out << absl::StrFormat(
        "exact, timed: its schedule drains at %.3f ms, each evicted buffer written back as it "
        "leaves and fetched from the first operation whose room holds it to its use (%d ahead, "
        "%d on demand)\n",
        exact_time->drained_us / 1e3, exact_time->fetched_ahead, exact_time->on_demand);
  }
  if (serving_ok) {
    const ServingOptimum& o = **serving;
    out << absl::StrFormat("%-8s %-8s %10.1f %10.1f %10.1f %10s %10s %10s %10.1f %10s\n", "serving",
                           "-", MiB(o.bytes_out), MiB(o.bytes_in), MiB(o.bytes_out + o.bytes_in),
                           "-", "-", "-", MiB(o.bytes_served), serving_proven ? "1.00" : "-");
  }
  PrintServing(serving, out);
  if (time_bound.ok()) {
    out << absl::StrFormat(
        "x time: each run's modelled time, copies drained, against %.3f ms, the least any schedule "
        "takes (compute %.3f ms; the bytes in, out and both ways over the link; the precedence "
        "the cap forces %.3f ms)\n",
        time_bound->us() / 1e3, time_bound->compute_us / 1e3, time_bound->precedence_us / 1e3);
  } else {
    out << "x time: not computed: " << time_bound.status().message() << "\n";
  }
  return 0;
}

}  // namespace stensor
