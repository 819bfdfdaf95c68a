// Megatron-Core's BERT sample: segments, truncation, masking, padding. See bert_masking.h.
// Tested in tests/unit/data/test_bert_data.cpp.
#include "data/bert_masking.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <unordered_set>
#include <utility>

#include "core/error.h"

namespace mt::data {
namespace {

std::string num(int64_t value) { return std::to_string(value); }

// RandomState.random(): numpy's mt19937_next_double, 53 bits from two 32-bit draws.
double numpy_random(NumpyRandomState& random) {
  const uint32_t a = random.next_uint32() >> 5;
  const uint32_t b = random.next_uint32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

// RandomState.randint(low, high) (int64, masked rejection): low + interval(high - 1 - low); no
// draw when high - low == 1.
int64_t numpy_randint(NumpyRandomState& random, int64_t low, int64_t high) {
  return low + static_cast<int64_t>(random.interval(static_cast<uint64_t>(high - 1 - low)));
}

// RandomState.choice(ngram_nvals, p=cdf's probabilities): 1 + searchsorted(cdf, random(), side='right').
int32_t choose_ngram(const std::vector<double>& cdf, NumpyRandomState& random) {
  const double u = numpy_random(random);
  return static_cast<int32_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin()) + 1;
}

// Whole-word candidates: runs of token positions, "##" pieces joined to the previous candidate.
std::vector<std::vector<int64_t>> masking_candidates(const std::vector<int64_t>& tokens,
                                                     const BertVocabulary& vocabulary, bool whole_word) {
  std::vector<std::vector<int64_t>> candidates;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t token = tokens[i];
    if (token == vocabulary.cls || token == vocabulary.sep) continue;
    if (token < 0 || token >= vocabulary.vocab_size())
      throw Error("BERT sample", "token " + num(token) + " is outside the vocabulary of " +
                                     num(vocabulary.vocab_size()) + " ids (Megatron: KeyError in inv_vocab)");
    if (vocabulary.is_subword[static_cast<size_t>(token)] && whole_word && !candidates.empty())
      candidates.back().push_back(static_cast<int64_t>(i));
    else
      candidates.push_back({static_cast<int64_t>(i)});
  }
  return candidates;
}

// n_maskings = min(p * target, max(1, int(round(tokens * p)))): a float, Python's round half to
// even (nearbyint in the default rounding mode).
double masking_budget(size_t tokens, int64_t target_length, double mask_prob) {
  const auto rounded = static_cast<int64_t>(std::nearbyint(static_cast<double>(tokens) * mask_prob));
  return std::min(mask_prob * static_cast<double>(target_length), static_cast<double>(std::max<int64_t>(1, rounded)));
}

// _get_token_mask: the replacement of one masked token, or the token itself (kept).
int64_t token_mask(int64_t token, NumpyRandomState& random, const BertVocabulary& vocabulary) {
  if (numpy_random(random) < 0.8) return vocabulary.mask;
  if (numpy_random(random) >= 0.5) return numpy_randint(random, 0, vocabulary.vocab_size());
  return token;
}

}  // namespace

void check_bert_masking_config(const BertVocabulary& vocabulary, const BertMaskingConfig& config) {
  if (!(config.mask_prob > 0 && config.mask_prob < 1))
    throw UsageError("--mask-prob", "must be in (0, 1), got " + std::to_string(config.mask_prob));
  if (config.max_ngram < 1) throw UsageError("BERT masking", "max_ngram must be >= 1");
  const int64_t size = vocabulary.vocab_size();
  for (const auto& [name, id] : {std::pair{"[CLS]", vocabulary.cls}, std::pair{"[SEP]", vocabulary.sep},
                                 std::pair{"[MASK]", vocabulary.mask}})
    if (id < 0 || id >= size)
      throw UsageError("BERT vocabulary", std::string(name) + " id " + num(id) + " is outside the vocabulary of " +
                                              num(size) + " ids");
}

std::vector<double> bert_ngram_cdf(int32_t max_ngram) {
  if (max_ngram < 1) throw UsageError("BERT masking", "max_ngram must be >= 1");
  std::vector<double> nprobs(static_cast<size_t>(max_ngram));
  for (int32_t n = 1; n <= max_ngram; ++n) nprobs[n - 1] = 1.0 / static_cast<double>(n);
  double total = numpy_sum(nprobs);
  for (double& p : nprobs) p /= total;
  total = numpy_sum(nprobs);  // p = nprobs[:n_ngrams] / nprobs[:n_ngrams].sum(), n_ngrams = max_ngram
  std::vector<double> cdf(nprobs.size());
  double running = 0;
  for (size_t i = 0; i < nprobs.size(); ++i) {
    running = i == 0 ? nprobs[0] / total : running + nprobs[i] / total;
    cdf[i] = running;
  }
  const double last = cdf.back();
  for (double& c : cdf) c /= last;
  return cdf;
}

BertMaskedPositions mask_bert_tokens(std::vector<int64_t>& tokens, int64_t target_length, NumpyRandomState& random,
                                     const BertVocabulary& vocabulary, const BertMaskingConfig& config) {
  check_bert_masking_config(vocabulary, config);
  const std::vector<int64_t> original = tokens;
  const auto candidates = masking_candidates(original, vocabulary, config.whole_word);
  const double budget = masking_budget(original.size(), target_length, config.mask_prob);
  // candidate_ngrams: entry c holds the n-grams candidates[c : c + n], n = 1..max_ngram.
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  random.shuffle(std::span<size_t>(order));
  const std::vector<double> cdf = bert_ngram_cdf(config.max_ngram);
  const auto ngram = [&](size_t first, int32_t n) {
    std::vector<int64_t> positions;
    for (size_t c = first; c < std::min(candidates.size(), first + static_cast<size_t>(n)); ++c)
      positions.insert(positions.end(), candidates[c].begin(), candidates[c].end());
    return positions;
  };
  std::vector<std::pair<int64_t, int64_t>> masked;  // (position, original token)
  std::unordered_set<int64_t> masked_positions;
  for (const size_t first : order) {
    if (static_cast<double>(masked.size()) >= budget) break;
    int32_t n = choose_ngram(cdf, random);
    std::vector<int64_t> positions;
    bool fits = false;
    for (; n > 0 && !fits; --n) {
      positions = ngram(first, n);
      fits = budget >= static_cast<double>(masked.size() + positions.size());
    }
    if (!fits) continue;
    if (std::any_of(positions.begin(), positions.end(), [&](int64_t p) { return masked_positions.count(p) > 0; }))
      continue;
    for (const int64_t p : positions) {
      masked_positions.insert(p);
      tokens[static_cast<size_t>(p)] = token_mask(original[static_cast<size_t>(p)], random, vocabulary);
      masked.emplace_back(p, original[static_cast<size_t>(p)]);
    }
  }
  std::sort(masked.begin(), masked.end());
  BertMaskedPositions out;
  for (const auto& [position, label] : masked) {
    out.positions.push_back(position);
    out.labels.push_back(label);
  }
  return out;
}

namespace {

// Segments A and B of a sample as [begin, end) ranges into one token buffer, so truncation from
// the front costs nothing.
struct Segments {
  std::vector<int64_t> a;
  std::vector<int64_t> b;
  size_t a_begin = 0, a_end = 0, b_begin = 0, b_end = 0;
  size_t a_size() const { return a_end - a_begin; }
  size_t b_size() const { return b_end - b_begin; }
};

// Steps 1-2 of the header: pivot, sentence-order swap, truncation to the target.
Segments split_and_truncate(const std::function<std::span<const int32_t>(int64_t)>& sentence, BertSampleRange range,
                            int64_t target, bool binary_head, NumpyRandomState& random, BertSample& sample) {
  const int64_t count = range.end_sentence - range.first_sentence;
  int64_t pivot = count;
  if (binary_head) {
    if (count < 2)
      throw Error("BERT sample", "sentences [" + num(range.first_sentence) + ", " + num(range.end_sentence) +
                                     ") are fewer than the 2 the binary head needs");
    pivot = count >= 3 ? numpy_randint(random, 1, count) : 1;
    sample.is_random = numpy_random(random) < 0.5;
  }
  Segments s;
  for (int64_t i = 0; i < count; ++i) {
    const auto tokens = sentence(range.first_sentence + i);
    (i < pivot ? s.a : s.b).insert((i < pivot ? s.a : s.b).end(), tokens.begin(), tokens.end());
  }
  if (sample.is_random) std::swap(s.a, s.b);
  s.a_end = s.a.size();
  s.b_end = s.b.size();
  sample.truncated = static_cast<int64_t>(s.a_size() + s.b_size()) > target;
  while (static_cast<int64_t>(s.a_size() + s.b_size()) > target) {
    const bool from_a = s.a_size() > s.b_size();
    size_t& begin = from_a ? s.a_begin : s.b_begin;
    size_t& end = from_a ? s.a_end : s.b_end;
    if (numpy_random(random) < 0.5)
      ++begin;
    else
      --end;
  }
  return s;
}

}  // namespace

BertSample make_bert_sample(const std::function<std::span<const int32_t>(int64_t)>& sentence, BertSampleRange range,
                            int64_t sample_index, const BertVocabulary& vocabulary, const BertMaskingConfig& config) {
  check_bert_masking_config(vocabulary, config);
  if (config.seq_length < 1) throw UsageError("--seq-length", "must be positive, got " + num(config.seq_length));
  if (range.target_length > config.seq_length)
    throw Error("BERT sample", "target length " + num(range.target_length) + " is over the sequence length " +
                                   num(config.seq_length));
  if (range.first_sentence < 0 || range.end_sentence < range.first_sentence)
    throw Error("BERT sample", "bad sentence range [" + num(range.first_sentence) + ", " +
                                   num(range.end_sentence) + ")");
  NumpyRandomState random(static_cast<uint32_t>(static_cast<uint64_t>(config.seed + sample_index) & 0xffffffffULL));
  BertSample sample;
  const Segments s = split_and_truncate(sentence, range, range.target_length, config.binary_head, random, sample);
  std::vector<int64_t> tokens{vocabulary.cls};
  tokens.insert(tokens.end(), s.a.begin() + s.a_begin, s.a.begin() + s.a_end);
  tokens.push_back(vocabulary.sep);
  std::vector<int64_t> types(tokens.size(), 0);
  if (s.b_size() > 0) {
    tokens.insert(tokens.end(), s.b.begin() + s.b_begin, s.b.begin() + s.b_end);
    tokens.push_back(vocabulary.sep);
    types.resize(tokens.size(), 1);
  }
  const BertMaskedPositions masked = mask_bert_tokens(tokens, range.target_length, random, vocabulary, config);
  const auto length = static_cast<int64_t>(tokens.size());
  if (length > config.seq_length)
    throw Error("BERT sample", num(length) + " tokens do not fit the sequence length " + num(config.seq_length));
  const auto seq = static_cast<size_t>(config.seq_length);
  const int64_t pad = vocabulary.pad;
  tokens.resize(seq, pad);
  types.resize(seq, pad);
  sample.padding_mask.assign(seq, 1);
  sample.labels.assign(seq, -1);
  sample.loss_mask.assign(seq, 0);
  for (size_t i = 0; i < seq; ++i)
    if (tokens[i] == pad) sample.padding_mask[i] = pad;
  for (size_t k = 0; k < masked.positions.size(); ++k) {
    sample.labels[static_cast<size_t>(masked.positions[k])] = masked.labels[k];
    sample.loss_mask[static_cast<size_t>(masked.positions[k])] = 1;
  }
  for (size_t i = 0; i < seq; ++i) {
    if (tokens[i] == pad) tokens[i] = 0;
    if (sample.labels[i] == pad) sample.labels[i] = 0;
  }
  sample.tokens = std::move(tokens);
  sample.types = std::move(types);
  return sample;
}

}  // namespace mt::data
