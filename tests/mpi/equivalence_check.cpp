// mt_equivalence_check RUN.jsonl REFERENCE.jsonl [--steps N] [--evals M] [--after K]: whether
// mt-train's step and eval records in RUN equal those of REFERENCE (a one-rank run of the same
// training) within the fp32 equivalence bound of tests/mpi/training_equivalence.h, iteration by
// iteration: the loss and grad norm, and for a MoE model the logged aux and z-loss values
// (Megatron's names) within the same bound and each MoE layer's tokens per expert (min, max)
// exactly. The bound at iteration t uses REFERENCE's learning rates of the steps before t (and
// --adam-eps from its run record), so a run resumed from a checkpoint compares from where it
// starts. --after K compares only iterations after K; --steps and --evals say how many must be
// compared. Exit 0 when equal (the largest difference as a share of its bound on stdout), 1 with
// the first difference on stderr, 2 on bad input. The Bats suites' comparisons of layouts
// (tests/tools/mt-train-mpi.bats) run through it, so the bound is written once.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "training_equivalence.h"

namespace {

struct Step {
  double loss = 0, grad_norm = 0, lr = 0;
  // A MoE model's logged losses under Megatron's names (load_balancing_loss, z_loss, ...), and each
  // MoE layer's tokens per expert after dropping [min, max] (equal across layouts in a dropless run).
  std::map<std::string, double> moe_losses;
  std::vector<int64_t> moe_tokens;
};

const char* const kMoeLosses[] = {"load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss",
                                  "z_loss"};

Step read_step(const nlohmann::json& record) {
  Step step{record.at("lm_loss").get<double>(), record.at("grad_norm").get<double>(), record.at("lr").get<double>(), {}, {}};
  for (const char* name : kMoeLosses) {
    if (record.contains(name)) step.moe_losses[name] = record.at(name).get<double>();
  }
  if (record.contains("moe_layers")) {
    for (const nlohmann::json& layer : record.at("moe_layers")) {
      step.moe_tokens.push_back(layer.at("tokens_min").get<int64_t>());
      step.moe_tokens.push_back(layer.at("tokens_max").get<int64_t>());
    }
  }
  return step;
}

struct Records {
  std::map<int64_t, Step> steps;
  std::map<int64_t, double> evals;
  double adam_eps = 0;
};

Records read_records(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  Records records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line);
    const std::string kind = record.value("record", "");
    if (kind == "run") {
      records.adam_eps = record.at("train").at("adam_eps").get<double>();
    } else if (kind == "step") {
      records.steps[record.at("iteration").get<int64_t>()] = read_step(record);
    } else if (kind == "eval") {
      records.evals[record.at("iteration").get<int64_t>()] = record.at("lm_loss").get<double>();
    }
  }
  return records;
}

int64_t option(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 3; i + 1 < argc; i += 2) {
    if (argv[i] == name) return std::stoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc % 2 == 0) {
    std::fprintf(stderr, "usage: %s RUN.jsonl REFERENCE.jsonl [--steps N] [--evals M] [--after K]\n", argv[0]);
    return 2;
  }
  try {
    const Records run = read_records(argv[1]), reference = read_records(argv[2]);
    if (!(reference.adam_eps > 0)) throw std::runtime_error(std::string(argv[2]) + ": no run record with train.adam_eps");
    const int64_t after = option(argc, argv, "--after", 0);
    const int64_t steps = option(argc, argv, "--steps", -1), evals = option(argc, argv, "--evals", -1);
    // The learning rates' sum over the reference's steps before `iteration`.
    const auto lr_sum_before = [&](int64_t iteration) {
      double sum = 0;
      for (const auto& [i, step] : reference.steps) sum += i < iteration ? step.lr : 0.0;
      return sum;
    };
    double worst_share = 0;
    const auto check = [&](const char* what, int64_t iteration, double a, double b, double lr_sum) {
      const double bound = mt::equivalence::equivalence_bound(lr_sum, reference.adam_eps);
      const double relative = std::fabs(a - b) / std::fabs(b);
      if (!(relative <= bound)) {
        std::fprintf(stderr, "%s at iteration %lld: %.9g against the reference's %.9g, %.3g relative, bound %.3g\n",
                     what, static_cast<long long>(iteration), a, b, relative, bound);
        return false;
      }
      worst_share = std::fmax(worst_share, relative / bound);
      return true;
    };
    int64_t compared_steps = 0, compared_evals = 0;
    for (const auto& [iteration, step] : run.steps) {
      if (iteration <= after) continue;
      const auto want = reference.steps.find(iteration);
      if (want == reference.steps.end()) {
        std::fprintf(stderr, "iteration %lld: no step record in %s\n", static_cast<long long>(iteration), argv[2]);
        return 1;
      }
      const double lr_sum = lr_sum_before(iteration);
      if (!check("lm loss", iteration, step.loss, want->second.loss, lr_sum)) return 1;
      if (!check("grad norm", iteration, step.grad_norm, want->second.grad_norm, lr_sum)) return 1;
      for (const auto& [name, value] : want->second.moe_losses) {
        const auto mine = step.moe_losses.find(name);
        if (mine == step.moe_losses.end()) {
          std::fprintf(stderr, "iteration %lld: no %s in %s\n", static_cast<long long>(iteration), name.c_str(), argv[1]);
          return 1;
        }
        if (!check(name.c_str(), iteration, mine->second, value, lr_sum)) return 1;
      }
      if (step.moe_tokens != want->second.moe_tokens) {
        std::fprintf(stderr, "iteration %lld: the MoE layers' tokens per expert (min, max) differ\n",
                     static_cast<long long>(iteration));
        return 1;
      }
      ++compared_steps;
    }
    for (const auto& [iteration, loss] : run.evals) {
      if (iteration <= after) continue;
      const auto want = reference.evals.find(iteration);
      if (want == reference.evals.end()) {
        std::fprintf(stderr, "evaluation after iteration %lld: none in %s\n", static_cast<long long>(iteration), argv[2]);
        return 1;
      }
      if (!check("eval loss", iteration, loss, want->second, lr_sum_before(iteration + 1))) return 1;
      ++compared_evals;
    }
    if ((steps >= 0 && compared_steps != steps) || (evals >= 0 && compared_evals != evals)) {
      std::fprintf(stderr, "compared %lld steps and %lld evaluations, expected %lld and %lld\n",
                   static_cast<long long>(compared_steps), static_cast<long long>(compared_evals),
                   static_cast<long long>(steps), static_cast<long long>(evals));
      return 1;
    }
    std::printf("equal within the bound: %lld steps, %lld evaluations, the largest difference %.3g of its bound\n",
                static_cast<long long>(compared_steps), static_cast<long long>(compared_evals), worst_share);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_equivalence_check: %s\n", e.what());
    return 2;
  }
}
