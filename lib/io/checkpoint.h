// HDF5 checkpoints of global tensors (docs/DESIGN.md, "Checkpoints"). One file holds every
// tensor by name with its global shape, float32, whatever layout wrote it:
//   /model/<name>                  the fp32 master parameters
//   /optimizer/exp_avg/<name>      Adam's moments (absent when saved without optimizer state)
//   /optimizer/exp_avg_sq/<name>
// each with a uint64 attribute `checksum`: the sum (mod 2^64) over its elements of a hash of
// (global linear index, float bits), so the checksum does not depend on how the tensor was split
// and the shares of several ranks add up to it. The root attributes hold the training state
// (CheckpointState). Version 1 files (parameters only, no checksums) are refused by version.
//
// A writer takes, per tensor, the slices this process holds (boxes of the global tensor given by
// global offset and extent; a flat run of a shard, as the distributed optimizer owns, is cut into
// boxes by flat_run_boxes). One process writes through serial HDF5; a group of ranks writes one
// file together through parallel HDF5 (the MPI-IO driver: datasets and attributes created
// collectively, each rank writing its own hyperslabs independently, which measured faster than
// collective transfers and than gathering to one writer: docs/DESIGN.md, "Checkpoints"). Each
// tensor's writeback to the disk starts as soon as it is written (sync_file_range), so the disk
// works while the next tensors are copied and checksummed. The file is written under a temporary
// name, fsynced (by every rank that wrote) and renamed; a failure at any point, on any rank,
// leaves the previous file untouched.
// A full disk: every writer first reserves a little room, freed just before H5Fcreate (whose
// superblock write fails badly on a full disk), so a disk without it is refused before HDF5 is
// involved. One process writes without HDF5's sieve buffer (a failed write is seen by the
// write, not by a later close), flushes before closing, and closes a failed file with HDF5's
// descriptor swapped for an in-memory one, so the close cannot fail and leaves no HDF5 id behind.
// A group cannot swap the MPI-IO file: its rank 0 first reserves 4 MiB of headroom beside the
// temporary (a file removed before the final flush and before closing a failed file), so the
// metadata a collective close writes finds room (a disk without even that is refused before
// anything is written), and the ranks agree on the write status after every tensor and before
// every close, so all of them take the same collective path (a rank whose write failed alone
// would otherwise sit in another collective than the rest). The error names the system's reason
// ("No space left on device", "File too large").
// For the crash tests, MT_CHECKPOINT_FAULT=<point>[:kill|:enospc] makes the write fail (or the
// process die by SIGKILL, or the disk look full) at a named point: mid-tensor, before-fsync,
// before-rename, before-tracker. With `enospc` one process's writes from mid-tensor on go to
// /dev/full, so HDF5 itself fails with ENOSPC; elsewhere the point fails with that error.
//
// A checkpoint directory (Megatron's): DIR/iter_NNNNNNN/checkpoint.h5 per saved iteration and
// DIR/latest_checkpointed_iteration.txt naming the newest, written the same way, last.
// Tested in tests/unit/io/test_checkpoint.cpp, tests/tools/mt-ckpt.bats (h5py reads it) and
// tests/tools/mt-train.bats (resume, preemption, crashes).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/temporary_file.h"

namespace mt::io {

inline constexpr int kCheckpointFormatVersion = 2;

// The root attributes: everything besides the tensors that a resumed run needs to continue
// exactly, and the configs (JSON) that say what wrote it.
struct CheckpointState {
  int64_t format_version = kCheckpointFormatVersion;  // as read; the writer always writes the current one
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_iters = 0;
  int64_t nan_iters = 0;
  // Loss scaler (optim/loss_scaler.h): scale, clean steps in a row, overflows left before halving.
  double loss_scale = 1.0;
  int64_t loss_scale_growth_tracker = 0;
  int64_t loss_scale_hysteresis_tracker = 0;
  uint64_t seed = 0;
  bool has_optimizer = false;  // the /optimizer group and optimizer_step are present
  int64_t optimizer_step = 0;  // Adam's step counter (bias correction)
  bool resumable = true;       // false: parameters only (--save-init/--save-final)
  // Where the counters above last started to follow the run's rules (train/checkpointing.h,
  // issue 28 W10): JSON, the root attribute counters_origin; "" in files that predate it.
  std::string counters_origin;
  std::string model_config = "{}", parallel_config = "{}", train_config = "{}";  // JSON
};

// A box of a global tensor: [offset[d], offset[d] + extent[d]) in every dimension d.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> extent;
  int64_t elements() const;
};

// A box and its values, row-major over the box's extent.
struct TensorSlice {
  Box box;
  const float* data = nullptr;
};

// The boxes (in the coordinates of `shape`, row-major order) that make up the flat run
// [begin, end) of a row-major tensor of `shape`: at most 2 * rank - 1 of them.
std::vector<Box> flat_run_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// The checksum share of one slice of a tensor of `global_shape` (see the header comment).
uint64_t slice_checksum(const std::vector<int64_t>& global_shape, const TensorSlice& slice);

class CheckpointWriter {
 public:
  // Starts `path` under a temporary name (its directory must exist). Throws mt::Error naming it.
  // With a `group` of several ranks (an MPI communicator; every rank sees the same file system)
  // the ranks write the file together and every call below is collective over the group: each
  // rank passes its own slices (none is fine) and the same names, shapes and state. The group's
  // rank 0 picks the temporary name and renames the file; its `path` is the one written.
  explicit CheckpointWriter(std::string path, comm::Communicator* group = nullptr);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // A tensor ("model/<name>", ...) of `global_shape` from the slices this process holds. The
  // slices of all ranks together must cover the tensor exactly once; the checksum is theirs.
  // `stored`: float32, or bfloat16/float16 (mt-ckpt convert: the values are rounded to nearest
  // even first, and the checksum is that of the rounded values as float32). One process throws
  // here on a bad slice or a failed write; in a group the rank keeps taking part in the
  // collective calls and commit() reports the first failing rank's error on every rank.
  void write_tensor(const std::string& name, const std::vector<int64_t>& global_shape,
                    const std::vector<TensorSlice>& slices, DType stored = DType::f32);
  // Writes the root attributes, closes, fsyncs and renames the file into place (fsyncing its
  // directory). Returns the bytes of the file (on every rank of a group). Throws the same
  // mt::Error on every rank of a group, with the temporary removed.
  int64_t commit(const CheckpointState& state);

 private:
  bool in_group() const { return group_ != nullptr; }
  // Records this rank's first failure (a group), or throws it (one process).
  void fail(const Error& error);
  // Collective in a group: throws on every rank the error of the lowest rank that recorded one,
  // after closing the file (the temporary is removed as the writer goes).
  void agree();
  // Closes a failed file: nothing more reaches the disk (one process) and the headroom is freed.
  void abandon_file();
  // Reserves `keep` bytes of headroom plus room for H5Fcreate; throws naming ENOSPC.
  void reserve_headroom(off_t keep);
  // Frees all but the kept headroom, just before H5Fcreate.
  void make_room_to_create();
  void release_headroom();
  // MT_CHECKPOINT_FAULT=mid-tensor:enospc: HDF5's descriptor now writes to /dev/full.
  void simulate_full_disk();


  std::string path_;
  comm::Communicator* group_ = nullptr;  // nullptr: this process alone
  std::optional<TemporaryFile> temporary_;  // the process that renames (a group's rank 0)
  std::optional<TemporaryFile> headroom_;   // the renaming process: disk space kept for the create and close
  off_t headroom_keep_ = 0;                 // kept after the create (a group's, for its collective close)
  std::string temporary_path_;
  int64_t file_id_ = -1;  // hid_t of the open temporary
  int writeback_fd_ = -1;  // the temporary again, to start the writeback of each written tensor
  int tensors_ = 0;
  std::string failure_;  // a group's rank: its first error, reported by agree()
  // A group's tensors, checked and given their checksums at commit, when every rank's share is known.
  std::vector<std::string> names_;
  std::vector<int64_t> totals_, covered_;
  std::vector<uint64_t> checksums_;
};

struct TensorInfo {
  std::string name;  // "model/<name>", "optimizer/exp_avg/<name>", ...
  std::vector<int64_t> shape;
  std::string dtype;              // "float32" for every tensor mt-train writes; "bfloat16", "float16" after mt-ckpt convert
  std::optional<uint64_t> checksum;  // the stored one
  int64_t bytes = 0;
};

class CheckpointReader {
 public:
  // Opens `path` and reads its root attributes; throws mt::Error naming the file and the field
  // for a file that is not an mt checkpoint, an unknown format version, a missing attribute.
  explicit CheckpointReader(std::string path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const CheckpointState& state() const { return state_; }
  // Every tensor in the file, in name order.
  std::vector<TensorInfo> tensors() const;
  bool has_tensor(const std::string& name) const;
  // Reads `box` of tensor `name` into `data` (row-major over the box; bfloat16/float16 tensors
  // widened exactly). Throws mt::Error naming the tensor when it is missing, not one of those
  // float types, or has another global shape than `global_shape`.
  void read_box(const std::string& name, const std::vector<int64_t>& global_shape, const Box& box, float* data) const;
  // The checksum of the stored values, recomputed, and how many are NaN or infinite (the whole
  // tensor is read in pieces of about 64 MB).
  struct Scan {
    uint64_t checksum = 0;
    int64_t nonfinite = 0;
  };
  Scan scan(const TensorInfo& tensor) const;
  // Every stored checksum against the values (one read of the whole file: the readers of a
  // checkpoint, --load, mt-ckpt export and convert, call it first; issue 28 W2). Throws mt::Error
  // naming the file and the first tensor whose values do not give its stored checksum.
  void verify_checksums() const;
  // Throws that error when `computed` (the checksum of the tensor's values as read) is not the
  // stored one; a tensor without a stored checksum passes.
  void check_checksum(const TensorInfo& tensor, uint64_t computed) const;

 private:
  std::string path_;
  int64_t file_id_ = -1;
  CheckpointState state_;
};

// "00a1b2c3d4e5f607": a checksum as records print it.
std::string checksum_text(uint64_t checksum);

// ---- checkpoint directories ----

std::string tracker_path(const std::string& directory);  // DIR/latest_checkpointed_iteration.txt
std::string checkpoint_path(const std::string& directory, int64_t iteration);  // DIR/iter_NNNNNNN/checkpoint.h5
// The iteration the tracker names; std::nullopt when there is no tracker. Throws mt::Error naming
// the tracker when it holds anything but a non-negative iteration (Megatron's "release" too).
std::optional<int64_t> read_tracker(const std::string& directory);
// The checkpoint file a user names (mt-train --load, mt-ckpt), whichever of the three forms: a
// checkpoint file as it is, an iteration directory's (DIR/iter_NNNNNNN) checkpoint.h5, or the one a
// --save directory's tracker names. std::nullopt for a directory holding neither a tracker nor a
// checkpoint.h5 (no checkpoint yet) and for a path that does not exist; a tracker naming a missing
// file is an mt::Error naming both, said of `subject` (the caller's name for the path: "--load DIR"),
// or of the path when it is empty.
std::optional<std::string> find_checkpoint(const std::string& path, const std::string& subject = "");
// Points the tracker at `iteration` (temporary, fsync, rename, directory fsync).
void write_tracker(const std::string& directory, int64_t iteration);
// Creates DIR and DIR/iter_NNNNNNN (fsyncing what it creates) and returns the checkpoint path.
std::string prepare_checkpoint_directory(const std::string& directory, int64_t iteration);

// The crash-test hook (see the header comment). What MT_CHECKPOINT_FAULT asks at `point`:
enum class Fault { none, error, kill, full_disk };
Fault requested_fault(const char* point);
// Throws mt::Error (full_disk: "No space left on device"), or raises SIGKILL, when
// MT_CHECKPOINT_FAULT names `point`.
void fault_point(const char* point);

}  // namespace mt::io
