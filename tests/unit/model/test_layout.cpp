// The parameter layout table and counter-based initialisation: offsets, fused groups, TP shards,
// no-decay set, and the same global model from every layout.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/layout.h"

using namespace mt::model;

TEST(Layout, CoversEveryParameterOnce) {
  for (const char* name : {"tiny-gpt", "tiny-llama", "gpt2-124m"}) {
    const ModelConfig c = preset(name);
    const ParamLayout layout = build_layout(c);
    EXPECT_EQ(layout.parameter_elements(), parameter_count(c, true)) << name;
    int64_t end = 0;
    for (const auto& e : layout.entries) {
      EXPECT_GE(e.offset, end) << e.name;
      end = e.offset + e.numel;
    }
    EXPECT_LE(end, layout.total_elements);
    EXPECT_EQ(layout.total_elements % 16, 0);
  }
  // Multi-token prediction is laid out after the head, under Megatron's mtp.layers.<k>. names and
  // its transformer layer under decoder.layers.<num_layers + k>., all with layer id num_layers + k.
  ModelConfig mtp = preset("tiny-llama");
  mtp.mtp_num_layers = 2;
  const ParamLayout with_mtp = build_layout(mtp);
  EXPECT_EQ(with_mtp.find("mtp.layers.1.eh_proj.weight").global_shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(with_mtp.find("mtp.layers.1.eh_proj.weight").layer, 3);
  EXPECT_EQ(with_mtp.find("mtp.layers.0.enorm.weight").layer, 2);
  EXPECT_EQ(with_mtp.find("decoder.layers.3.self_attention.linear_q.weight").layer, 3);
  EXPECT_GT(with_mtp.find("mtp.layers.0.hnorm.weight").offset, with_mtp.find("decoder.final_layernorm.weight").offset);
}

TEST(Layout, FusedGroupsAreContiguousAndGroupsAligned) {
  const ParamLayout layout = build_layout(preset("tiny-llama"));
  const auto& q = layout.find("decoder.layers.1.self_attention.linear_q.weight");
  const auto& k = layout.find("decoder.layers.1.self_attention.linear_k.weight");
  const auto& v = layout.find("decoder.layers.1.self_attention.linear_v.weight");
  EXPECT_EQ(q.offset % 16, 0);
  EXPECT_EQ(k.offset, q.offset + q.numel);
  EXPECT_EQ(v.offset, k.offset + k.numel);
  const auto& gate = layout.find("decoder.layers.0.mlp.linear_fc1_gate.weight");
  const auto& up = layout.find("decoder.layers.0.mlp.linear_fc1_up.weight");
  EXPECT_EQ(up.offset, gate.offset + gate.numel);
  EXPECT_EQ(layout.try_find("decoder.layers.0.self_attention.linear_q.bias"), nullptr);
  EXPECT_EQ(q.global_shape, (std::vector<int64_t>{64, 64}));   // 4 heads x 16
  EXPECT_EQ(k.global_shape, (std::vector<int64_t>{32, 64}));   // 2 groups x 16
}

TEST(Layout, NoDecayForBiasesAndNorms) {
  const ParamLayout layout = build_layout(preset("tiny-gpt"));
  EXPECT_TRUE(layout.find("embedding.word_embeddings.weight").weight_decay);
  EXPECT_TRUE(layout.find("decoder.layers.0.mlp.linear_fc1.weight").weight_decay);
  EXPECT_FALSE(layout.find("decoder.layers.0.mlp.linear_fc1.bias").weight_decay);
  EXPECT_FALSE(layout.find("decoder.final_layernorm.weight").weight_decay);
  EXPECT_EQ(layout.try_find("output_layer.weight"), nullptr);  // tied
}

TEST(Layout, TensorParallelShardsAreContiguousRanges) {
  const ModelConfig c = preset("tiny-gpt");
  mt::parallel::ParallelConfig tp2;
  tp2.tensor_model_parallel_size = 2;
  mt::parallel::RankCoordinates rank1;
  rank1.tp = 1;
  const ParamLayout layout = build_layout(c, tp2, rank1, 0, c.num_layers);
  const auto& fc1 = layout.find("decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_EQ(fc1.shard_dim, 0);
  EXPECT_EQ(fc1.shard_offset, 128);
  EXPECT_EQ(fc1.local_shape, (std::vector<int64_t>{128, 64}));
  const auto& fc2 = layout.find("decoder.layers.0.mlp.linear_fc2.weight");
  EXPECT_EQ(fc2.shard_dim, 1);
  EXPECT_EQ(fc2.local_shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(layout.find("decoder.layers.0.input_layernorm.weight").shard_dim, -1);
  mt::parallel::ParallelConfig tp3;
  tp3.tensor_model_parallel_size = 3;
  EXPECT_THROW(build_layout(c, tp3, {}, 0, c.num_layers), mt::UsageError);
}

TEST(Init, EveryLayoutStartsFromTheSameGlobalModel) {
  const ModelConfig c = preset("tiny-gpt");
  const ParamLayout whole = build_layout(c);
  std::vector<float> reference(static_cast<size_t>(whole.total_elements));
  initialize_parameters(whole, 42, reference.data());
  mt::parallel::ParallelConfig tp2;
  tp2.tensor_model_parallel_size = 2;
  for (int r = 0; r < 2; ++r) {
    mt::parallel::RankCoordinates rank;
    rank.tp = r;
    const ParamLayout shard = build_layout(c, tp2, rank, 0, c.num_layers);
    std::vector<float> local(static_cast<size_t>(shard.total_elements));
    initialize_parameters(shard, 42, local.data());
    for (const auto& e : shard.entries) {
      const auto& g = whole.find(e.name);
      if (e.local_shape.size() != 2) continue;
      for (int64_t i = 0; i < e.local_shape[0]; ++i)
        for (int64_t j = 0; j < e.local_shape[1]; ++j) {
          const int64_t gi = i + (e.shard_dim == 0 ? e.shard_offset : 0);
          const int64_t gj = j + (e.shard_dim == 1 ? e.shard_offset : 0);
          ASSERT_EQ(local[e.offset + i * e.local_shape[1] + j], reference[g.offset + gi * g.global_shape[1] + gj])
              << e.name;
        }
    }
  }
}

TEST(Init, MegatronScheme) {
  const ModelConfig c = preset("tiny-gpt");
  const ParamLayout layout = build_layout(c);
  std::vector<float> p(static_cast<size_t>(layout.total_elements));
  initialize_parameters(layout, 7, p.data());
  auto stddev = [&](const std::string& name) {
    const auto& e = layout.find(name);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < e.numel; ++i) {
      sum += p[e.offset + i];
      sq += p[e.offset + i] * p[e.offset + i];
    }
    return std::sqrt(sq / e.numel - (sum / e.numel) * (sum / e.numel));
  };
  EXPECT_NEAR(stddev("decoder.layers.0.mlp.linear_fc1.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("decoder.layers.0.mlp.linear_fc2.weight"), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ(p[layout.find("decoder.layers.1.pre_mlp_layernorm.weight").offset], 1.0f);
  EXPECT_EQ(p[layout.find("decoder.layers.1.pre_mlp_layernorm.bias").offset], 0.0f);
  EXPECT_EQ(p[layout.find("decoder.layers.1.mlp.linear_fc1.bias").offset], 0.0f);
  std::vector<float> again(p.size());
  initialize_parameters(layout, 7, again.data());
  EXPECT_EQ(p, again);
  initialize_parameters(layout, 8, again.data());
  EXPECT_NE(p, again);
}

// --- layout v2: copies and grad-reduction groups, chunks, buckets ------------------------------

namespace {

mt::parallel::ParallelConfig parallel_config(int tp, int pp = 1, int dp = 1, bool sequence_parallel = false) {
  mt::parallel::ParallelConfig p;
  p.tensor_model_parallel_size = tp;
  p.pipeline_model_parallel_size = pp;
  p.data_parallel_size = dp;
  p.sequence_parallel = sequence_parallel;
  return p;
}

mt::parallel::RankCoordinates coordinates(int tp, int pp = 0) {
  mt::parallel::RankCoordinates rank;
  rank.tp = tp;
  rank.pp = pp;
  return rank;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Replicated over TP: the norms, the row-parallel biases and the position table; everything else
// is split by whole heads, query groups, ffn columns or vocabulary rows.
bool expected_replicated(const std::string& name) {
  return name.find("layernorm") != std::string::npos || ends_with(name, "linear_proj.bias") ||
         ends_with(name, "linear_fc2.bias") || name == "embedding.position_embeddings.weight";
}

}  // namespace

TEST(LayoutV2, CopiesAndReduceGroupsOfGptAndLlamaAtTp124) {
  for (const char* preset_name : {"gpt2-124m", "llama3-8b", "tiny-gpt"}) {
    const ModelConfig c = preset(preset_name);
    for (int tp : {1, 2, 4}) {
      for (bool sp : {false, true}) {
        SCOPED_TRACE(std::string(preset_name) + " tp " + std::to_string(tp) + (sp ? " sp" : ""));
        const auto parallel = parallel_config(tp, 1, 1, sp);
        std::vector<ParamLayout> ranks;
        for (int r = 0; r < tp; ++r) ranks.push_back(build_layout(c, parallel, coordinates(r), 0, c.num_layers));
        for (size_t i = 0; i < ranks[0].entries.size(); ++i) {
          const ParamEntry& e = ranks[0].entries[i];
          SCOPED_TRACE(e.name);
          const bool replicated = expected_replicated(e.name);
          EXPECT_EQ(e.split == TensorSplit::replicated, replicated);
          EXPECT_EQ(e.data_parallel_group, DataParallelGroup::dense);
          EXPECT_FALSE(e.tied_copy);
          EXPECT_FALSE(e.reduce_over_embedding_group);  // one pipeline stage
          // Under SP the replicated tensors that see 1/TP of the tokens are summed over TP; the
          // position table is looked up on every token by every TP rank and is not.
          EXPECT_EQ(e.reduce_over_tensor_parallel,
                    sp && tp > 1 && replicated && e.name != "embedding.position_embeddings.weight");
          int64_t covered = 0;
          for (int r = 0; r < tp; ++r) {
            const ParamEntry& shard = ranks[static_cast<size_t>(r)].entries[i];
            ASSERT_EQ(shard.name, e.name);
            // Every TP rank holds a replicated tensor whole; rank 0's copy is the primary.
            EXPECT_EQ(shard.replica, replicated ? r : 0);
            if (!replicated && tp > 1) {
              EXPECT_EQ(shard.shard_offset, covered);
              covered += shard.shard_extent;
            }
          }
          if (!replicated && tp > 1) {
            EXPECT_EQ(covered, e.global_shape[static_cast<size_t>(e.shard_dim)]);
          }
        }
        // Whole heads and query groups per rank.
        const ParamEntry& q = ranks.back().find("decoder.layers.0.self_attention.linear_q.weight");
        const ParamEntry& k = ranks.back().find("decoder.layers.0.self_attention.linear_k.weight");
        EXPECT_EQ(q.local_shape[0], c.num_attention_heads / tp * c.head_dim());
        EXPECT_EQ(k.local_shape[0], c.query_groups() / tp * c.head_dim());
        EXPECT_EQ(k.shard_offset, (tp - 1) * (c.query_groups() / tp) * c.head_dim());
      }
    }
  }
}

TEST(LayoutV2, TensorParallelismRefusesToCutAHead) {
  // tiny-llama has 2 query groups: TP 4 would put half a key/value head on each rank.
  try {
    build_layout(preset("tiny-llama"), parallel_config(4), coordinates(0), 0, 2);
    FAIL() << "TP 4 over 2 query groups was accepted";
  } catch (const mt::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--num-query-groups 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("whole query groups"), std::string::npos) << e.what();
  }
  // The element counts divide (2 groups x 64 channels = 128 rows over 4 ranks): still refused.
  ModelConfig wide = preset("tiny-llama");
  wide.kv_channels = 64;
  EXPECT_THROW(build_layout(wide, parallel_config(4), coordinates(1), 0, 2), mt::UsageError);
  ModelConfig six_heads = preset("tiny-gpt");
  six_heads.num_attention_heads = 6;
  six_heads.num_query_groups = 6;
  six_heads.kv_channels = 16;
  try {
    build_layout(six_heads, parallel_config(4), coordinates(0), 0, 2);
    FAIL() << "TP 4 over 6 heads was accepted";
  } catch (const mt::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--num-attention-heads 6"), std::string::npos) << e.what();
  }
  ModelConfig odd_ffn = preset("tiny-gpt");
  odd_ffn.ffn_hidden_size = 250;
  EXPECT_THROW(build_layout(odd_ffn, parallel_config(4), coordinates(0), 0, 2), mt::UsageError);
}

TEST(LayoutV2, ChunksOnOneRankShareOneFlatBufferAndTheTiedEmbedding) {
  ModelConfig c = preset("tiny-gpt");
  c.num_layers = 4;
  const ParamLayout whole = build_layout(c);
  const ParamLayout split = build_layout(c, parallel_config(1), coordinates(0),
                                         std::vector<ChunkSpec>{{0, 1, true, false}, {1, 4, false, true}});
  ASSERT_EQ(split.chunks.size(), 2u);
  EXPECT_EQ(split.chunks[0].begin, 0);
  EXPECT_EQ(split.chunks[0].end, split.chunks[1].begin);
  EXPECT_EQ(split.chunks[1].end, split.total_elements);
  EXPECT_EQ(split.parameter_elements(), whole.parameter_elements());  // no tied copy on one rank
  for (const ParamEntry& e : split.entries) {
    SCOPED_TRACE(e.name);
    const ModelChunk& chunk = split.chunks[static_cast<size_t>(e.chunk)];
    EXPECT_GE(e.offset, chunk.begin);
    EXPECT_LE(e.offset + e.numel, chunk.end);
    const bool first = e.layer == kEmbeddingLayer || (e.layer >= 0 && e.layer < 1);
    EXPECT_EQ(e.chunk, first ? 0 : 1);
    EXPECT_EQ(e.global_shape, whole.find(e.name).global_shape);
    EXPECT_FALSE(e.tied_copy);
  }
  EXPECT_EQ(split.find("decoder.final_layernorm.weight").layer, head_layer(c));
  EXPECT_EQ(split.find("embedding.word_embeddings.weight").layer, kEmbeddingLayer);
}

TEST(LayoutV2, ThePipelinesLastStageHoldsATiedCopyReducedOverTheEmbeddingGroup) {
  const ModelConfig c = preset("tiny-gpt");
  const auto pp2 = parallel_config(1, 2);
  const ParamLayout first = build_layout(c, pp2, coordinates(0, 0), 0, 1);
  const ParamLayout last = build_layout(c, pp2, coordinates(0, 1), 1, 2);
  const ParamEntry& word = first.find("embedding.word_embeddings.weight");
  const ParamEntry& copy = last.find("embedding.word_embeddings.weight");
  EXPECT_FALSE(word.tied_copy);
  EXPECT_EQ(word.replica, 0);
  EXPECT_TRUE(copy.tied_copy);
  EXPECT_EQ(copy.replica, 1);  // not counted twice in grad norms, not written twice
  EXPECT_EQ(copy.layer, head_layer(c));
  EXPECT_TRUE(word.reduce_over_embedding_group);
  EXPECT_TRUE(copy.reduce_over_embedding_group);
  EXPECT_EQ(first.try_find("decoder.final_layernorm.weight"), nullptr);
  EXPECT_EQ(last.try_find("embedding.position_embeddings.weight"), nullptr);
  // Each copy sits in a bucket of its own (Megatron's shared-embedding bucket).
  for (const ParamLayout* layout : {&first, &last}) {
    for (const ParamEntry& e : layout->entries) {
      if (e.name != "embedding.word_embeddings.weight") {
        EXPECT_NE(e.bucket, layout->find("embedding.word_embeddings.weight").bucket) << e.name;
      }
    }
  }
  // Untied models need no group.
  ModelConfig untied = c;
  untied.untie_embeddings_and_output_weights = true;
  EXPECT_FALSE(build_layout(untied, pp2, coordinates(0, 0), 0, 1).find("embedding.word_embeddings.weight")
                   .reduce_over_embedding_group);
}

TEST(LayoutV2, BucketsFormBackwardAtGroupBoundariesAndPadForTheDistributedOptimizer) {
  const ModelConfig c = preset("tiny-llama");
  const ParamLayout single = build_layout(c);
  ASSERT_EQ(single.buckets.size(), 1u);
  EXPECT_EQ(single.buckets[0].begin, 0);
  EXPECT_EQ(single.buckets[0].padded_end, single.total_elements);
  EXPECT_EQ(single.buckets[0].first_layer, kEmbeddingLayer);
  EXPECT_EQ(single.buckets[0].last_layer, head_layer(c));

  BucketOptions small;
  small.bucket_elements = 20000;
  const ParamLayout bucketed = build_layout(c, parallel_config(1), coordinates(0), {{0, 2, true, true}}, small);
  ASSERT_GT(bucketed.buckets.size(), 2u);
  // Without the distributed optimizer, buckets only group: the offsets are those of one bucket.
  for (size_t i = 0; i < single.entries.size(); ++i) EXPECT_EQ(bucketed.entries[i].offset, single.entries[i].offset);
  // Formed backward: the last bucket holds the head; each bucket but the first (backward's last)
  // reaches the size; fused groups never straddle two buckets.
  EXPECT_EQ(bucketed.buckets.back().last_layer, head_layer(c));
  for (size_t b = 1; b < bucketed.buckets.size(); ++b) {
    EXPECT_GE(bucketed.buckets[b].end - bucketed.buckets[b].begin, small.bucket_elements) << b;
    EXPECT_EQ(bucketed.buckets[b].begin, bucketed.buckets[b - 1].padded_end);
  }
  const auto& q = bucketed.find("decoder.layers.1.self_attention.linear_q.weight");
  EXPECT_EQ(q.bucket, bucketed.find("decoder.layers.1.self_attention.linear_v.weight").bucket);
  EXPECT_EQ(bucketed.find("decoder.layers.0.mlp.linear_fc1_gate.weight").bucket,
            bucketed.find("decoder.layers.0.mlp.linear_fc1_up.weight").bucket);
  for (const ParamEntry& e : bucketed.entries) {
    const GradBucket& bucket = bucketed.buckets[static_cast<size_t>(e.bucket)];
    EXPECT_GE(e.offset, bucket.begin) << e.name;
    EXPECT_LE(e.offset + e.numel, bucket.end) << e.name;
    EXPECT_GE(e.layer, bucket.first_layer) << e.name;
    EXPECT_LE(e.layer, bucket.last_layer) << e.name;
  }

  // Distributed optimizer over DP 3: bucket ends padded to lcm(3, 128) = 384 elements (what
  // optim::DistributedOptimizer::bucket_options asks for; tests/unit/optim), so every DP rank owns
  // an equal contiguous slice of each bucket.
  BucketOptions sharded = small;
  sharded.pad(DataParallelGroup::dense) = 384;
  const ParamLayout padded = build_layout(c, parallel_config(1, 1, 3), coordinates(0), {{0, 2, true, true}}, sharded);
  ASSERT_EQ(padded.buckets.size(), bucketed.buckets.size());
  EXPECT_EQ(padded.parameter_elements(), single.parameter_elements());
  for (size_t b = 0; b < padded.buckets.size(); ++b) {
    const GradBucket& bucket = padded.buckets[b];
    EXPECT_EQ(bucket.begin % 384, 0) << b;
    EXPECT_EQ(bucket.padded_end % 384, 0) << b;
    int64_t next = bucket.begin;
    for (int r = 0; r < 3; ++r) {
      const auto [begin, end] = padded.bucket_shard(static_cast<int>(b), r, 3);
      EXPECT_EQ(begin, next);
      EXPECT_EQ(end - begin, (bucket.padded_end - bucket.begin) / 3);
      next = end;
    }
    EXPECT_EQ(next, bucket.padded_end);
  }
  EXPECT_THROW(bucketed.bucket_shard(0, 0, 7), mt::Error);  // not padded for 7 ranks
}

namespace {

DeclaredParam declared(const std::string& name, std::vector<int64_t> shape, int layer, int fused_group,
                       DataParallelGroup group = DataParallelGroup::dense, int chunk = 0) {
  DeclaredParam d;
  d.entry.name = name;
  d.entry.global_shape = d.entry.local_shape = shape;
  d.entry.numel = 1;
  for (int64_t extent : shape) d.entry.numel *= extent;
  d.entry.layer = layer;
  d.entry.chunk = chunk;
  d.entry.data_parallel_group = group;
  d.fused_group = fused_group;
  return d;
}

// Two chunks of a MoE-shaped model, declared in forward order: dense attention, norms and
// embedding, and per layer a fused expert group (fc1, fc2) reduced over the expert-DP group.
std::vector<DeclaredParam> moe_declarations() {
  const DataParallelGroup expert = DataParallelGroup::expert;
  return {declared("embedding.word_embeddings.weight", {40, 24}, kEmbeddingLayer, 0),
          declared("decoder.layers.0.self_attention.linear_qkv.weight", {72, 24}, 0, 1),
          declared("decoder.layers.0.self_attention.linear_qkv.bias", {72}, 0, 1),
          declared("decoder.layers.0.mlp.experts.linear_fc1.weight", {2, 48, 24}, 0, 2, expert),
          declared("decoder.layers.0.mlp.experts.linear_fc2.weight", {2, 24, 48}, 0, 2, expert),
          declared("decoder.layers.0.pre_mlp_layernorm.weight", {24}, 0, 3),
          declared("decoder.layers.1.self_attention.linear_qkv.weight", {72, 24}, 1, 4),
          declared("decoder.layers.1.mlp.experts.linear_fc1.weight", {2, 48, 24}, 1, 5, expert),
          declared("decoder.layers.1.mlp.experts.linear_fc2.weight", {2, 24, 48}, 1, 5, expert),
          declared("decoder.layers.2.self_attention.linear_qkv.weight", {72, 24}, 2, 6, DataParallelGroup::dense, 1),
          declared("decoder.layers.2.mlp.experts.linear_fc1.weight", {2, 48, 24}, 2, 7, expert, 1),
          declared("decoder.final_layernorm.weight", {24}, 3, 8, DataParallelGroup::dense, 1)};
}

}  // namespace

TEST(LayoutV2, BucketsArePerReductionGroupAndPaddedToTheirGroupsMultiple) {
  const std::vector<ChunkBlocks> chunks{ChunkBlocks{{0, 2, true, false}, {}, {}, {}}, ChunkBlocks{{2, 3, false, true}, {}, {}, {}}};
  BucketOptions options;
  options.bucket_elements = 2000;
  options.pad(DataParallelGroup::dense) = 384;   // as for DP x CP = 3
  options.pad(DataParallelGroup::expert) = 128;  // as for expert-DP = 2
  const std::vector<DeclaredParam> all = moe_declarations();
  const ParamLayout layout = lay_out(all, chunks, options);
  ASSERT_EQ(layout.entries.size(), all.size());
  int dense_buckets = 0, expert_buckets = 0;
  for (const GradBucket& bucket : layout.buckets) {
    const int64_t pad = bucket.group == DataParallelGroup::expert ? 128 : 384;
    EXPECT_EQ(bucket.begin % pad, 0);
    EXPECT_EQ(bucket.padded_end % pad, 0);
    EXPECT_GE(bucket.padded_end, bucket.end);
    ++(bucket.group == DataParallelGroup::expert ? expert_buckets : dense_buckets);
  }
  EXPECT_GE(dense_buckets, 3);
  EXPECT_GE(expert_buckets, 3);
  for (const ParamEntry& e : layout.entries) {
    // A bucket holds tensors of one reduction group, of its own chunk, between its layers.
    const GradBucket& bucket = layout.buckets[static_cast<size_t>(e.bucket)];
    EXPECT_EQ(bucket.group, e.data_parallel_group) << e.name;
    EXPECT_EQ(bucket.chunk, e.chunk) << e.name;
    EXPECT_GE(e.offset, bucket.begin) << e.name;
    EXPECT_LE(e.offset + e.numel, bucket.end) << e.name;
    EXPECT_GE(e.layer, bucket.first_layer) << e.name;
    EXPECT_LE(e.layer, bucket.last_layer) << e.name;
  }
  // Fused groups stay adjacent and in one bucket.
  const ParamEntry& fc1 = layout.find("decoder.layers.1.mlp.experts.linear_fc1.weight");
  const ParamEntry& fc2 = layout.find("decoder.layers.1.mlp.experts.linear_fc2.weight");
  EXPECT_EQ(fc2.offset, fc1.offset + fc1.numel);
  EXPECT_EQ(fc2.bucket, fc1.bucket);
  // Within each chunk the dense buckets come first, then the expert ones; chunks do not mix.
  for (size_t b = 1; b < layout.buckets.size(); ++b) {
    const GradBucket& previous = layout.buckets[b - 1];
    const GradBucket& bucket = layout.buckets[b];
    EXPECT_GE(bucket.begin, previous.padded_end);
    if (bucket.chunk == previous.chunk) {
      EXPECT_GE(bucket.group, previous.group) << b;
    }
  }
  EXPECT_EQ(layout.chunks[1].begin, layout.chunks[0].end);
  EXPECT_EQ(layout.chunks[0].end, layout.buckets[static_cast<size_t>(fc1.bucket)].padded_end);

  // The dense tensors lie exactly where they would without the expert tensors.
  std::vector<DeclaredParam> dense_only;
  for (const DeclaredParam& d : all) {
    if (d.entry.data_parallel_group == DataParallelGroup::dense && d.entry.chunk == 0) dense_only.push_back(d);
  }
  const ParamLayout plain = lay_out(dense_only, {chunks[0]}, options);
  for (const ParamEntry& e : plain.entries) EXPECT_EQ(layout.find(e.name).offset, e.offset) << e.name;

  // A fused group may not span two reduction groups.
  std::vector<DeclaredParam> mixed = all;
  mixed[4].entry.data_parallel_group = DataParallelGroup::dense;
  EXPECT_THROW(lay_out(mixed, chunks, options), mt::Error);
}

TEST(Init, ChunksAndTensorParallelShardsStartFromTheSameGlobalModel) {
  for (const char* preset_name : {"tiny-gpt", "tiny-llama"}) {
    ModelConfig c = preset(preset_name);
    c.num_layers = 3;
    const ParamLayout whole = build_layout(c);
    std::vector<float> reference(static_cast<size_t>(whole.total_elements));
    initialize_parameters(whole, 42, reference.data());
    for (int tp : {1, 2}) {
      for (int r = 0; r < tp; ++r) {
        const ParamLayout chunks = build_layout(c, parallel_config(tp), coordinates(r),
                                                std::vector<ChunkSpec>{{0, 2, true, false}, {2, 3, false, true}});
        std::vector<float> local(static_cast<size_t>(chunks.total_elements));
        initialize_parameters(chunks, 42, local.data());
        for (const ParamEntry& e : chunks.entries) {
          const ParamEntry& g = whole.find(e.name);
          const int64_t cols = e.local_shape.size() == 2 ? e.local_shape[1] : 1;
          for (int64_t i = 0; i < e.numel; ++i) {
            const int64_t row = i / cols, col = i % cols;
            const int64_t global_row = row + (e.shard_dim == 0 ? e.shard_offset : 0);
            const int64_t global_col = col + (e.shard_dim == 1 ? e.shard_offset : 0);
            const int64_t global_cols = g.local_shape.size() == 2 ? g.local_shape[1] : 1;
            ASSERT_EQ(local[static_cast<size_t>(e.offset + i)],
                      reference[static_cast<size_t>(g.offset + global_row * global_cols + global_col)])
                << preset_name << " tp " << tp << " rank " << r << " " << e.name << "[" << i << "]";
          }
        }
      }
    }
  }
}

// Tensors of any rank (expert weights will be (experts, out, in)) shard along one dimension and
// still draw each global element once: a (3, 8, 5) tensor cut along its middle dimension.
TEST(Init, ThreeDimensionalShardsAreSlicesOfTheWholeTensor) {
  const ModelConfig c = preset("tiny-gpt");
  auto layout_of = [&c](int64_t shard_offset, int64_t extent) {
    ParamLayout layout;
    ParamEntry e;
    e.name = "decoder.layers.0.mlp.experts.weight";
    e.init = Init::normal(c.init_method_std);
    e.global_shape = {3, 8, 5};
    e.local_shape = {3, extent, 5};
    e.shard_dim = extent == 8 ? -1 : 1;
    e.shard_offset = shard_offset;
    e.shard_extent = extent;
    e.numel = 3 * extent * 5;
    layout.entries.push_back(e);
    layout.total_elements = e.numel;
    return layout;
  };
  std::vector<float> whole(120), shard(60);
  initialize_parameters(layout_of(0, 8), 5, whole.data());
  initialize_parameters(layout_of(4, 4), 5, shard.data());
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 4; ++b)
      for (int k = 0; k < 5; ++k) ASSERT_EQ(shard[(a * 4 + b) * 5 + k], whole[(a * 8 + b + 4) * 5 + k]) << a << b << k;
  EXPECT_NE(whole[0], whole[1]);
}

// Mixture of experts: each EP rank holds only its experts, split over expert-TP (not TP), reduced
// over expert-DP, its local experts' fc1 and fc2 each one fused group in expert order; the router
// is replicated and summed over TP under SP; the shared experts are a dense MLP over TP.
TEST(LayoutV2, ExpertTensorsLiveOnTheirExpertParallelRankSplitOverExpertTensorParallel) {
  ModelConfig c = preset("tiny-mixtral");  // 8 experts of width 32, hidden 64, 2 layers
  c.moe_shared_expert_intermediate_size = 48;
  const auto expert = [](int layer, int e, const char* tensor) {
    return "decoder.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + "." + tensor;
  };
  for (int ep : {1, 2, 4}) {
    mt::parallel::ParallelConfig p = parallel_config(1);
    p.expert_model_parallel_size = ep;
    for (int r = 0; r < ep; ++r) {
      mt::parallel::RankCoordinates rank;
      rank.ep = r;
      const ParamLayout layout = build_layout(c, p, rank, 0, c.num_layers);
      const int local = 8 / ep;
      for (int e = 0; e < 8; ++e) {
        const bool here = e / local == r;
        EXPECT_EQ(layout.try_find(expert(1, e, "linear_fc2.weight")) != nullptr, here) << "EP " << ep << " rank " << r;
      }
      const ParamEntry& gate0 = layout.find(expert(0, r * local, "linear_fc1_gate.weight"));
      EXPECT_EQ(gate0.data_parallel_group, DataParallelGroup::expert);
      EXPECT_EQ(gate0.local_shape, (std::vector<int64_t>{32, 64}));
      for (int j = 0; j < local; ++j) {  // the grouped GEMM's base + stride
        EXPECT_EQ(layout.find(expert(0, r * local + j, "linear_fc1_gate.weight")).offset, gate0.offset + j * 2 * 32 * 64);
        EXPECT_EQ(layout.find(expert(0, r * local + j, "linear_fc1_up.weight")).offset,
                  gate0.offset + j * 2 * 32 * 64 + 32 * 64);
        EXPECT_EQ(layout.find(expert(0, r * local + j, "linear_fc2.weight")).offset,
                  layout.find(expert(0, r * local, "linear_fc2.weight")).offset + j * 64 * 32);
      }
      const ParamEntry& router = layout.find("decoder.layers.0.mlp.router.weight");
      EXPECT_EQ(router.global_shape, (std::vector<int64_t>{8, 64}));
      EXPECT_EQ(router.data_parallel_group, DataParallelGroup::dense);
      EXPECT_TRUE(layout.try_find("decoder.layers.0.mlp.router.expert_bias") == nullptr);  // a buffer, not a parameter
      EXPECT_EQ(layout.find("decoder.layers.0.mlp.shared_experts.linear_fc2.weight").global_shape,
                (std::vector<int64_t>{64, 48}));
      // Every bucket holds one reduction group.
      for (const ParamEntry& entry : layout.entries) {
        EXPECT_EQ(layout.buckets[static_cast<size_t>(entry.bucket)].group, entry.data_parallel_group) << entry.name;
      }
    }
  }
  // The one-rank layout counts every parameter once.
  EXPECT_EQ(build_layout(c).parameter_elements(), parameter_count(c, true));

  // TP 2 with SP and expert-TP 2: experts split over etp by their own ffn, the router replicated
  // over TP and summed over it, the shared experts split over TP.
  mt::parallel::ParallelConfig p = parallel_config(2, 1, 1, true);
  p.expert_model_parallel_size = 2;
  p.expert_tensor_parallel_size = 2;
  for (int etp = 0; etp < 2; ++etp) {
    mt::parallel::RankCoordinates rank = coordinates(1 - etp);  // dense tp differs from etp: the split follows etp
    rank.expert_tp = etp;
    rank.ep = 1;
    const ParamLayout layout = build_layout(c, p, rank, 0, c.num_layers);
    const ParamEntry& gate = layout.find(expert(0, 4, "linear_fc1_gate.weight"));
    EXPECT_EQ(gate.shard_offset, 16 * etp);
    EXPECT_EQ(gate.local_shape, (std::vector<int64_t>{16, 64}));
    const ParamEntry& fc2 = layout.find(expert(0, 7, "linear_fc2.weight"));
    EXPECT_EQ(fc2.shard_dim, 1);
    EXPECT_EQ(fc2.shard_offset, 16 * etp);
    EXPECT_FALSE(gate.reduce_over_tensor_parallel);
    EXPECT_TRUE(gate.primary());
    EXPECT_EQ(layout.try_find(expert(0, 3, "linear_fc2.weight")), nullptr);
    const ParamEntry& router = layout.find("decoder.layers.1.mlp.router.weight");
    EXPECT_TRUE(router.reduce_over_tensor_parallel);
    EXPECT_EQ(router.replica, 1 - etp);
    EXPECT_EQ(layout.find("decoder.layers.0.mlp.shared_experts.linear_fc1_up.weight").shard_offset, 24 * (1 - etp));
  }
  // Expert-TP must split the expert width: refused by its flag.
  p.expert_tensor_parallel_size = 3;
  try {
    build_layout(c, p, coordinates(0), 0, c.num_layers);
    ADD_FAILURE() << "expert-TP 3 accepted for --moe-ffn-hidden-size 32";
  } catch (const mt::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-tensor-parallel-size 3"), std::string::npos) << e.what();
  }
}

TEST(LayoutV2, PipelineStagesHoldTheirLayersExpertsAndADenseStageHasNone) {
  ModelConfig c = preset("tiny-mixtral");
  c.num_layers = 4;
  c.moe_layer_pattern = {1, 1, 0, 0};  // the second stage is dense
  mt::parallel::ParallelConfig p = parallel_config(1, 2);
  p.expert_model_parallel_size = 2;
  for (int ep = 0; ep < 2; ++ep) {
    mt::parallel::RankCoordinates first = coordinates(0, 0), second = coordinates(0, 1);
    first.ep = second.ep = ep;
    const ParamLayout moe = build_layout(c, p, first, pipeline_chunks(c, p, 0));
    const ParamLayout dense = build_layout(c, p, second, pipeline_chunks(c, p, 1));
    int experts = 0;
    for (const ParamEntry& entry : moe.entries) {
      if (entry.data_parallel_group == DataParallelGroup::expert) {
        ++experts;
        EXPECT_LT(entry.layer, 2) << entry.name;
      }
    }
    EXPECT_EQ(experts, 2 * 4 * 3);  // 2 layers x 4 local experts x (gate, up, fc2)
    for (const ParamEntry& entry : dense.entries) {
      EXPECT_EQ(entry.data_parallel_group, DataParallelGroup::dense) << entry.name;
    }
    EXPECT_NE(dense.try_find("decoder.layers.3.mlp.linear_fc2.weight"), nullptr);
  }
}
