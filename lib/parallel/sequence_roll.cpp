// Multi-token prediction's roll across context-parallel ranks (see sequence_roll.h).
#include "parallel/sequence_roll.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace mt::parallel {

void roll_left_one(const backend::Ops& ops, backend::Stream stream, comm::Communicator* cp_group, const void* in,
                   void* out, int batch, int64_t local_seq, DType dtype, void* boundary) {
  const auto kind = backend::CopyKind::device_to_device;
  const int64_t e = static_cast<int64_t>(dtype_size(dtype));
  const auto* source = static_cast<const char*>(in);
  auto* target = static_cast<char*>(out);
  const int cp = cp_group ? cp_group->size() : 1;
  if (cp == 1) {
    // torch.roll(shifts=-1) with the rolled-in last position set to 0.
    ops.zero(out, batch * local_seq * e, stream);
    if (local_seq > 1) ops.copy_2d(out, local_seq * e, source + e, local_seq * e, (local_seq - 1) * e, batch, kind, stream);
    return;
  }
  if (local_seq < 2 || local_seq % 2 != 0) {
    throw Error("context-parallel roll", "a rank's " + std::to_string(local_seq) +
                                             " tokens per sample are not two equal chunks");
  }
  const int64_t chunk = local_seq / 2, b = batch;
  const int rank = cp_group->rank();
  // boundary: [early chunks' first elements | late chunks' first | early chunks' new last | late chunks' new last],
  // each (batch).
  auto* edges = static_cast<char*>(boundary);
  char* early_first = edges;
  char* late_first = edges + b * e;
  char* early_last = edges + 2 * b * e;
  char* late_last = edges + 3 * b * e;
  ops.copy_2d(early_first, e, source, local_seq * e, e, b, kind, stream);
  ops.copy_2d(late_first, e, source + chunk * e, local_seq * e, e, b, kind, stream);
  // Each chunk rolls within itself: (batch x 2 chunks) rows of `chunk` elements.
  ops.copy_2d(out, chunk * e, source + e, chunk * e, (chunk - 1) * e, 2 * b, kind, stream);

  // The early chunk's first elements go to rank i - 1 (its early chunk's successor), the late
  // chunk's to rank i + 1 (its late chunk precedes ours); ours come back from i + 1 and i - 1.
  std::vector<int64_t> send_counts(static_cast<size_t>(cp), 0), send_offsets(send_counts.size(), 0);
  std::vector<int64_t> recv_counts(send_counts.size(), 0), recv_offsets(send_counts.size(), 0);
  if (rank > 0) {
    send_counts[static_cast<size_t>(rank - 1)] = b;
    recv_counts[static_cast<size_t>(rank - 1)] = b;
    recv_offsets[static_cast<size_t>(rank - 1)] = b;
  }
  if (rank + 1 < cp) {
    send_counts[static_cast<size_t>(rank + 1)] = b;
    send_offsets[static_cast<size_t>(rank + 1)] = b;
    recv_counts[static_cast<size_t>(rank + 1)] = b;
  }
  cp_group->all_to_allv(early_first, send_counts.data(), send_offsets.data(), early_last, recv_counts.data(),
                        recv_offsets.data(), dtype);
  if (rank == 0) ops.zero(late_last, b * e, stream);  // the sequence's last position
  if (rank + 1 == cp) ops.copy(early_last, late_first, b * e, kind, stream);  // chunk CP - 1 is followed by our chunk CP
  ops.copy_2d(target + (chunk - 1) * e, local_seq * e, early_last, e, e, b, kind, stream);
  ops.copy_2d(target + (local_seq - 1) * e, local_seq * e, late_last, e, e, b, kind, stream);
}

}  // namespace mt::parallel
