// The stage worker's messages (runtime/control/stage_messages.cpp and the settings'
// codec): round trips, every field the decoder refuses, and 8-byte fields a hostile
// buffer places off their alignment.
#include "runtime/control/messages.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "runtime/control/schema/control_generated.h"
#include "tests/runtime/control/raw_message.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using test::raw;
using testing::expectThrowWith;
namespace fb = tandem::control;

Assign sampleAssign() {
  Assign a;
  a.job = "cnn-3stage";
  a.model_spec = "name: tiny\ninput: [4]\nlayers: [{type: linear, out: 2}]\n";
  a.stage = 1;
  a.stages = 3;
  a.replica = 1;
  a.replicas = 2;
  a.prev_replicas = 1;
  a.next_replicas = 2;
  a.slice.layers.begin = 3;
  a.slice.layers.end = 6;
  a.slice.device = "opencl:0";
  a.slice.threads = 2;
  a.train.schedule = ScheduleKind::kGPipe;
  a.train.microbatches = 4;
  a.train.batch = 32;
  a.train.epochs = 2;
  a.train.seed = 7;
  a.train.recompute = true;
  a.train.microbatch_shares = {3, 1};
  a.train.rebalance_steps = 5;
  a.train.optimizer.kind = "adamw";
  a.train.optimizer.lr = 0.001f;
  a.train.optimizer.lr_schedule = "step";
  a.train.optimizer.warmup_steps = 5;
  a.train.optimizer.decay_steps = 100;
  a.train.optimizer.decay_factor = 0.5f;
  a.wire.activations = WireCodec::kF16;
  a.wire.gradients = WireCodec::kI8;
  a.data.train_limit = 300;
  a.data.test_limit = 100;
  a.wire.timeout_s = 30;
  a.record_spans = true;
  a.save = true;
  a.bind_host = "10.0.0.5";
  a.weights_hash = std::string(64, 'a');
  a.weights_bytes = 1234;
  a.encrypt = true;
  a.checkpoint.every_steps = 100;
  a.checkpoint.start_step = 250;
  a.checkpoint.restore_optimizer = true;
  a.infer_from = 64;
  a.request_rate = 250.5;
  return a;
}

// A message whose bytes lie at an address 4 bytes off an 8-byte boundary (the verifier
// checks alignment from the buffer's start, not in memory): its 8-byte span structs are
// copied out, not read in place (undefined behaviour, which UBSan in the sanitizer build
// reports; a fault on some ARM cores). The fuzzer found a hostile message that did it.
TEST(MessagesTest, AReportAtAnOddAddressDecodesItsSpans) {
  StageReport report;
  report.spans = {{ActionType::kForward, 3, 1.0, 1.5}, {ActionType::kBackward, 4, 2.0, 2.5}};
  const std::vector<uint8_t> bytes = encodeMessage(report);
  std::vector<uint64_t> storage(bytes.size() / 8 + 2);  // 8-byte aligned
  auto* odd = reinterpret_cast<uint8_t*>(storage.data()) + 4;
  std::memcpy(odd, bytes.data(), bytes.size());
  const Message back = decodeMessage({odd, bytes.size()});
  ASSERT_TRUE(std::holds_alternative<StageReport>(back)) << messageName(back);
  EXPECT_EQ(std::get<StageReport>(back).spans, report.spans);
}

// The verifier checks a vector's length for alignment, not its elements; the fuzzer found
// buffers whose 8-byte elements lie at 4 mod 8, read in place by the decoder (undefined
// behaviour, which UBSan in the sanitizer build reports). This moves the encoded vector of
// `values` in `bytes` to the end, its elements at 4 mod 8, and points its field there.
template <typename T>
std::vector<uint8_t> moveOffAlignment(std::vector<uint8_t> bytes, const std::vector<T>& values) {
  static_assert(sizeof(T) == 8);
  // The vector as FlatBuffers lays it out: its length, then the values.
  std::vector<uint8_t> vector(4 + values.size() * 8, 0);
  const auto length = static_cast<uint32_t>(values.size());
  std::memcpy(vector.data(), &length, 4);
  const auto* from = reinterpret_cast<const uint8_t*>(values.data());
  std::copy(from, from + values.size() * 8, vector.begin() + 4);
  const auto found = std::search(bytes.begin(), bytes.end(), vector.begin(), vector.end());
  EXPECT_NE(found, bytes.end());
  const auto at = static_cast<uint32_t>(found - bytes.begin());
  EXPECT_EQ(at % 8, 4u);  // its elements 8-aligned, as built
  // The field that points at it: a forward offset from its own place.
  uint32_t field = 0;
  for (uint32_t f = 0; f + 4 <= at; f += 4) {
    uint32_t offset = 0;
    std::memcpy(&offset, bytes.data() + f, 4);
    if (f + offset == at) field = f;
  }
  EXPECT_NE(field, 0u);
  while (bytes.size() % 8 != 0) bytes.push_back(0);
  const auto moved = static_cast<uint32_t>(bytes.size());   // the length at 0 mod 8, the
  bytes.insert(bytes.end(), vector.begin(), vector.end());  // values at 4 mod 8
  const uint32_t offset = moved - field;
  std::memcpy(bytes.data() + field, &offset, 4);
  return bytes;
}

// An assignment's chunks off their alignment are copied out, not read in place, and a
// chunk outside the stage's layers is refused by name.
TEST(MessagesTest, AnAssignsChunksOffTheirAlignmentAreCopiedOut) {
  Assign a = sampleAssign();  // stage 1 of 3, layers [3, 6)
  a.train.schedule = ScheduleKind::kInterleaved1F1B;
  a.replica = 0;
  a.replicas = 1;
  a.next_replicas = 1;
  a.slice.chunks = {{3, 4}, {5, 7}};
  const std::vector<uint8_t> bytes =
      moveOffAlignment(encodeMessage(a), std::vector<int64_t>{3, 4, 5, 7});
  expectThrowWith<FormatError>(
      [&] { decodeMessage(bytes); },
      {"bad control message 'assign': chunk 1 [5, 7)", "outside layers [3, 6)"});
}

// So are a profile task's more batches (the fuzzer found it after protocol 3.1 added them).
TEST(MessagesTest, AProfileTasksBatchesOffTheirAlignmentAreCopiedOut) {
  ProfileTask t;
  t.model_spec = "name: m";
  t.batch = 8;
  t.devices = {{"cpu", 1, 0}};
  t.more_batches = {2, 4, 16};
  const std::vector<uint8_t> bytes = moveOffAlignment(encodeMessage(t), t.more_batches);
  const Message back = decodeMessage(bytes);
  ASSERT_TRUE(std::holds_alternative<ProfileTask>(back)) << messageName(back);
  EXPECT_EQ(std::get<ProfileTask>(back).more_batches, t.more_batches);
  std::vector<uint8_t> repeated = bytes;
  const int64_t four = 4;
  std::memcpy(repeated.data() + repeated.size() - 8, &four, 8);  // 2, 4, 4
  expectThrowWith<FormatError>([&] { decodeMessage(repeated); },
                               {"'profile task'", "batch 4 is asked twice"});
}

// And an assignment's microbatch shares, the one vector of doubles (the fuzzer found it
// under UBSan in CI after protocol 3.3 added them).
TEST(MessagesTest, AnAssignsSharesOffTheirAlignmentAreCopiedOut) {
  Assign a = sampleAssign();
  a.train.microbatch_shares = {3, 1};
  const std::vector<uint8_t> bytes = moveOffAlignment(encodeMessage(a), a.train.microbatch_shares);
  const Message back = decodeMessage(bytes);
  ASSERT_TRUE(std::holds_alternative<Assign>(back)) << messageName(back);
  EXPECT_EQ(std::get<Assign>(back).train.microbatch_shares, a.train.microbatch_shares);
  std::vector<uint8_t> negative = bytes;
  const double minus = -1;
  std::memcpy(negative.data() + negative.size() - 8, &minus, 8);  // 3, -1
  expectThrowWith<FormatError>([&] { decodeMessage(negative); },
                               {"'assign'", "a microbatch share is not in (0, 1e9]"});
}

// A checkpoint's shares (protocol 3.5) likewise, and checked as an assignment's are.
TEST(MessagesTest, ACheckpointsSharesAreCopiedOutAndChecked) {
  const Checkpointed c{6, std::string(64, 'a'), 100, {0.75, 0.25}};
  const std::vector<uint8_t> bytes = moveOffAlignment(encodeMessage(c), c.shares);
  const Message back = decodeMessage(bytes);
  ASSERT_TRUE(std::holds_alternative<Checkpointed>(back)) << messageName(back);
  EXPECT_EQ(std::get<Checkpointed>(back), c);
  for (const double spoilt : {0.0, -1.0, std::nan(""), 2e9}) {
    std::vector<uint8_t> bad = bytes;
    std::memcpy(bad.data() + bad.size() - 8, &spoilt, 8);  // 0.75, spoilt
    expectThrowWith<FormatError>([&] { decodeMessage(bad); },
                                 {"'checkpointed'", "a share is not in (0, 1e9]"});
  }
  Checkpointed many = c;
  many.shares.assign(kMaxReplicaShares + 1, 1.0);
  expectThrowWith<InvalidArgument>([&] { encodeMessage(many); },
                                   {"'checkpointed'", "65 shares exceed the limit of 64"});
}

TEST(MessagesTest, EveryStageWorkerMessageSurvivesARoundTrip) {
  StageReport report;
  report.counters = {1.5, 0.1, 1.2, 0.3, 0.2, 0.05, 3, 40};
  report.run_s = 2.5;
  report.bytes_sent = 1000;
  report.bytes_received = 2000;
  report.spans = {{ActionType::kForward, 3, 1.0, 1.5}, {ActionType::kStep, -1, 2.0, 2.1}};
  report.model_hash = std::string(64, 'c');
  report.model_bytes = 3;
  report.weights_shipped = 5000;
  report.weights_ship_s = 0.25;
  report.weights_corrupted = true;
  report.step_mean_s = 0.021;
  report.steps_timed = 126;
  report.start_rss_bytes = 50 << 20;
  report.peak_rss_bytes = 90 << 20;
  report.peak_tensor_bytes = 17 << 20;
  StageReport split_report = report;
  split_report.tensor_ranks = {{1.25, 0.1, 1.1, 0.2, 0.0, 0.0, 3, 40, 320},
                               {1.5, 0.1, 1.2, 0.3, 0.0, 0.0, 2, 40, 320}};
  const Assign plain;
  Assign zero_bubble = sampleAssign();
  zero_bubble.train.schedule = ScheduleKind::kZeroBubbleH1;
  Assign interleaved = sampleAssign();  // stage 1 of 3, layers [3, 6) in two chunks
  interleaved.train.schedule = ScheduleKind::kInterleaved1F1B;
  interleaved.replica = 0;
  interleaved.replicas = 1;
  interleaved.next_replicas = 1;
  interleaved.slice.chunks = {{3, 4}, {5, 6}};
  Assign split = sampleAssign();
  split.replica = 0;
  split.replicas = 1;
  split.slice.tensor = 3;
  split.slice.tensor_shares = {1, 2.5, 1};
  split.slice.tensor_devices = {"opencl:0", "cpu", "opencl:1"};
  const std::vector<Message> all = {
      sampleAssign(),
      plain,
      split,
      zero_bubble,
      interleaved,
      Ready{{"tcp://127.0.0.1:5000"}, {"a", "b"}, "cpu", 300, 100},
      Start{{}, {"tcp://x:1"}, 300, 100},
      GroupAddress{"tcp://127.0.0.1:6000"},
      WeightsRequest{std::string(64, 'b')},
      WeightsChunk{std::string(64, 'b'), 3, 10, {1, 2, 3}},
      Launch{2, "10.0.0.1:5000", {}},
      Launched{2, 77},
      WorkerEnded{2, "(pid 77) exited with code 0", false},
      LinkTask{5, LinkTaskKind::kMeasure, "10.0.0.2", "tcp://x:1", 65536, 4, 1, 3},
      LinkTask{5, LinkTaskKind::kServe, "10.0.0.2", "tcp://x:1", 65536, 4, 1, 3, true},
      LinkResult{5, "tcp://10.0.0.2:4000", 1e9, 1e-5, 2e-5, 1e-5, 3e-5, 3, 0.25, 1 << 20, "b0a1",
                 0.125},
      LinkResult{5, "", 1e9, 1e-5, 2e-5, 1e-5, 3e-5, 3, 0.25, 1 << 20, "b0a1", 0.125, 0.5, 3 << 20},
      GroupAddresses{{"x", "y"}},
      Progress{0, 3, 10, 0.5, 100, 1},
      EpochDone{1, 0.4, 10, 3000, 0.45, 0.88},
      InferDone{100, 0.4, 0.9, 0.2},
      report,
      split_report,
      Failed{"stage 1 failed"},
      Checkpointed{300, std::string(64, 'd'), 4096, {}},
      Checkpointed{300, std::string(64, 'd'), 4096, {0.6, 0.3, 0.1}},
      Answer{96, 2, 3, {0.5f, -1, 2, 3, 4, std::nanf("")}, 1.25, 1},
      ProfileTask{"name: m\n", 8, 1, 5, {{"cpu", 2, 1}, {"opencl:0", 1, 0}}, 4, {4, 2, 1}},
      ProfileResult{"{\"schema\": \"tandem-profile\"}", 1, {"{}", "{\"a\": 1}"}},
      Prompt{3, {104, 105}, 20, 0.8f, 40, uint64_t{1} << 40, 0.9f},
      PromptsDone{},
      CancelPrompt{int64_t{1} << 40},
      Token{3, 19, 255, std::nanf("")},
      StageBusy{40, 130, 0.75, 1.5}};
  for (const Message& m : all) {
    const Message back = decodeMessage(encodeMessage(m));
    EXPECT_EQ(back.index(), m.index()) << messageName(m);
    EXPECT_TRUE(back == m) << messageName(m);
  }
}

TEST(MessagesTest, AnAssignmentThatCannotBeRunIsRefusedNamingTheField) {
  struct Case {
    void (*spoil)(Assign&);
    const char* expect;
  } cases[] = {
      {[](Assign& a) { a.stage = 3; }, "stage 3 is not in [0, 2]"},
      {[](Assign& a) { a.replica = 2; }, "replica 2 is not in [0, 1]"},
      {[](Assign& a) { a.stage = 0; }, "prev_replicas 1 is not in [0, 0]"},
      {[](Assign& a) { a.stage = 2; }, "next_replicas 2 is not in [0, 0]"},
      {[](Assign& a) { a.slice.layers.end = 3; }, "layer_end 3 is not in [4,"},
      {[](Assign& a) { a.train.microbatches = 33; }, "microbatches 33 is not in [1, 32]"},
      {[](Assign& a) { a.slice.threads = 0; }, "threads 0"},
      {[](Assign& a) { a.slice.tensor = 0; }, "tensor 0 is not in [1, 64]"},
      {[](Assign& a) { a.slice.tensor = 65; }, "tensor 65 is not in [1, 64]"},
      {[](Assign& a) {
         a.replica = 0;
         a.replicas = 1;
         a.slice.tensor = 2;
         a.slice.tensor_shares = {1, 2, 3};
       },
       "3 tensor shares for 2 tensor ranks"},
      {[](Assign& a) {
         a.replica = 0;
         a.replicas = 1;
         a.slice.tensor = 2;
         a.slice.tensor_shares = {1, -2};
       },
       "a tensor share is not in (0, 1e9]"},
      {[](Assign& a) {
         a.replica = 0;
         a.replicas = 1;
         a.slice.tensor = 2;
         a.slice.tensor_devices = {"cpu"};
       },
       "1 tensor devices for 2 tensor ranks"},
      {[](Assign& a) {
         a.replica = 0;
         a.replicas = 1;
         a.slice.tensor = 2;
         a.slice.tensor_devices = {"cpu", "opencl:0"};
       },
       "tensor rank 0's device 'cpu' is not the stage's 'opencl:0'"},
      {[](Assign& a) { a.slice.tensor = 2; },
       "a tensor-split stage cannot be a generation's first, be interleaved or have replicas"},
      {[](Assign& a) { a.wire.timeout_s = 0; }, "timeout_s 0"},
      {[](Assign& a) { a.wire.gradients = static_cast<WireCodec>(9); },
       "gradients codec 9 is not in [0, 3]"},
      {[](Assign& a) { a.train.optimizer.lr = -1; }, "learning rate -1"},
      {[](Assign& a) {
         a.train.microbatch_shares = {3, 0};
       },
       "a microbatch share is not in (0, 1e9]"},
      {[](Assign& a) {
         a.train.microbatch_shares = {3, std::nan("")};
       },
       "a microbatch share is not in (0, 1e9]"},
      {[](Assign& a) { a.train.rebalance_steps = -1; }, "rebalance_steps -1 is not in [0, 1000]"},
      {[](Assign& a) { a.train.rebalance_steps = 1001; }, "rebalance_steps 1001 is not in [0,"},
      {[](Assign& a) { a.train.optimizer.lr_schedule = "linear"; }, "lr_schedule 'linear'"},
      {[](Assign& a) { a.train.optimizer.warmup_steps = -1; }, "warmup_steps -1 is not in [0,"},
      {[](Assign& a) { a.bind_host = "a/b"; }, "bind_host 'a/b' is not a host"},
      {[](Assign& a) { a.data.train_limit = -1; }, "train_limit is negative"},
      {[](Assign& a) { a.weights_hash = "abc"; }, "weights_hash 'abc' is not 64 hex digits"},
      {[](Assign& a) { a.weights_bytes = 0; }, "weights_bytes 0 is not in [1,"},
      {[](Assign& a) { a.checkpoint.every_steps = -1; }, "checkpoint_every -1 is not in [0,"},
      {[](Assign& a) { a.checkpoint.start_step = -5; }, "start_step -5 is not in [0,"},
      {[](Assign& a) {
         a.weights_hash.clear();
         a.weights_bytes = 0;
         a.checkpoint.restore_optimizer = true;
       },
       "restore_optimizer without starting weights"},
      {[](Assign& a) { a.infer_from = 10; }, "infer_from 10 is not a multiple of the batch 32"},
      {[](Assign& a) { a.request_rate = -1; }, "request_rate -1.000000 is not in [0, 1e6]"},
      {[](Assign& a) { a.request_rate = std::nan(""); }, "request_rate nan is not in"},
      {[](Assign& a) { a.mode = RunMode::kGenerate; }, "replicas 2 is not in [1, 1]"},
      {[](Assign& a) {
         a.mode = RunMode::kGenerate;
         a.replica = 0;
         a.replicas = 1;
       },
       "next_replicas 2 is not in [1, 1]"},
      {[](Assign& a) {
         a.mode = RunMode::kGenerate;
         a.replica = 0;
         a.replicas = 1;
         a.next_replicas = 1;
         a.in_flight = 0;
       },
       "in_flight 0 is not in [1, 1024]"},
  };
  for (const Case& c : cases) {
    Assign a = sampleAssign();
    c.spoil(a);
    expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(a)); }, {"'assign'", c.expect});
  }
  // An interleaved stage's chunks: pairs in order within its layers, with the schedule,
  // one replica and the ring's links.
  const Case interleaved[] = {
      {[](Assign& a) {
         a.slice.chunks = {{3, 4}, {3, 6}};
       },
       "chunk 1 [3, 6) is empty, out of order"},
      {[](Assign& a) {
         a.slice.chunks = {{3, 4}, {5, 7}};
       },
       "outside layers [3, 6)"},
      {[](Assign& a) {
         a.slice.chunks = {{4, 5}, {5, 6}};
       },
       "do not span layers [3, 6)"},
      {[](Assign& a) {
         a.slice.chunks = {{3, 6}};
       },
       "2 chunk bounds: expected begin, end pairs"},
      {[](Assign& a) { a.train.schedule = ScheduleKind::k1F1B; },
       "chunks need the interleaved schedule"},
      {[](Assign& a) { a.slice.chunks.clear(); },
       "the interleaved schedule needs 2 or more chunks"},
      {[](Assign& a) { a.replicas = 2; }, "replicas 2 is not in [1, 1]"},
      {[](Assign& a) {
         a.stage = 2;
         a.next_replicas = 0;
       },
       "next_replicas 0 is not in [1, 1]"},
      {[](Assign& a) {
         a.stage = 0;
         a.stages = 1;
         a.prev_replicas = a.next_replicas = 0;
       },
       "chunks on a pipeline of one stage"},
  };
  for (const Case& c : interleaved) {
    Assign a = sampleAssign();
    a.train.schedule = ScheduleKind::kInterleaved1F1B;
    a.replica = 0;
    a.replicas = 1;
    a.next_replicas = 1;
    a.slice.chunks = {{3, 4}, {5, 6}};
    ASSERT_NO_THROW(decodeMessage(encodeMessage(a)));
    c.spoil(a);
    expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(a)); }, {"'assign'", c.expect});
  }
  StageReport r;
  r.spans = {{static_cast<ActionType>(9), 0, 0, 1}};
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"'stage report'", "a span's type 9"});
  r.spans = {{ActionType::kForward, 0, 2, 1}};
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); }, {"ends before it starts"});
  r.spans.clear();
  r.tensor_ranks = {{1, 0, 1, 0, 0, 0, 1, 1, 1}, {1, 0, -1, 0, 0, 0, 1, 1, 1}};
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"a tensor rank's counters", "compute_cpu_s"});
  r.tensor_ranks = {{1, 0, 1, 0, 0, 0, 1, -4, 1}};
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"a tensor rank's counters", "microbatches"});
  r.tensor_ranks.clear();
  r.spans.clear();
  r.model_hash = "xyz";
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"model_hash 'xyz' is not 64 hex digits"});
  r.model_hash = std::string(64, 'c');
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"model_bytes 0 is not in [1,"});
  r.model_hash.clear();
  r.counters.busy_s = -1;
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); }, {"busy_s -1"});
  r.counters.busy_s = 0;
  r.step_mean_s = std::nan("");
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); }, {"step_mean_s"});
  r.step_mean_s = 0;
  r.peak_rss_bytes = -5;
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"peak_rss_bytes is negative"});
  r.peak_rss_bytes = 0;
  r.peak_tensor_bytes = -2;
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(r)); },
                               {"peak_tensor_bytes -2 is not in [-1,"});
  r.peak_tensor_bytes = -1;  // not counted: fine
  EXPECT_EQ(std::get<StageReport>(decodeMessage(encodeMessage(r))).peak_tensor_bytes, -1);
  // A diverged run's loss is NaN: it still gets through (and a fuzzer's value compare
  // must not trip on it); an accuracy outside [0, 1] does not.
  const Message nan_loss = decodeMessage(encodeMessage(InferDone{10, std::nan(""), 0.5, 1}));
  EXPECT_TRUE(std::isnan(std::get<InferDone>(nan_loss).loss));
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(InferDone{10, 0, 1.5, 1}));
      },
      {"'infer done'", "accuracy 1.5"});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(EpochDone{0, 0.1, 1, 1, 0.1, 1.5e167}));
      },
      {"'epoch done'", "test_accuracy"});  // (the fuzzer's: once a float-to-int overflow)
  // An answer whose outputs do not fill its rows, or that claims more right than rows.
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(Answer{0, 2, 3, {1, 2}, 0, 0}));
      },
      {"'answer'", "2 outputs for 2 rows of 3"});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(Answer{0, 1, 1, {1}, 0, 2}));
      },
      {"'answer'", "correct 2 is not in [0, 1]"});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(Answer{-4, 1, 1, {1}, 0, 0}));
      },
      {"'answer'", "first -4"});
  // Generation: stage 0 and the last stage are linked (one worker each) when generating,
  // and only then.
  Assign ring = sampleAssign();
  ring.mode = RunMode::kGenerate;
  ring.replica = 0;
  ring.replicas = 1;
  ring.stage = 0;
  ring.next_replicas = 1;
  const Message ring_back = decodeMessage(encodeMessage(ring));
  EXPECT_EQ(std::get<Assign>(ring_back).prev_replicas, 1);
  ring.mode = RunMode::kTrain;
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(ring)); },
                               {"prev_replicas 1 is not in [0, 0]"});
  // A stage runs one mode: the wire's infer and generate flags are never both set.
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(raw([](flatbuffers::FlatBufferBuilder& b) {
          fb::AssignBuilder ab(b);
          ab.add_stages(1);
          ab.add_replicas(1);
          ab.add_infer(true);
          ab.add_generate(true);
          return std::pair{fb::Body_Assign, ab.Finish().Union()};
        }));
      },
      {"'assign'", "a stage cannot both infer and generate"});
  // Prompts and tokens outside what a generation run can mean.
  struct PromptCase {
    Prompt p;
    const char* expect;
  } prompt_cases[] = {
      {{0, {}, 5, 0, 0, 1}, "no tokens"},
      {{0, {65, -2}, 5, 0, 0, 1}, "token -2 is negative"},
      {{0, {65}, 0, 0, 0, 1}, "count 0 is not in [1,"},
      {{-1, {65}, 5, 0, 0, 1}, "id -1 is not in [0, 2147483647]"},
      {{0, {65}, 5, std::nanf(""), 0, 1}, "temperature nan"},
      {{0, {65}, 5, -0.5f, 0, 1}, "temperature -0.5"},
      {{0, {65}, 5, 0, -3, 1}, "top_k is negative"},
      {{0, {65}, 5, 0, 0, 1, 0.0f}, "top_p 0.000000 is not in (0, 1]"},
      {{0, {65}, 5, 0, 0, 1, std::nanf("")}, "top_p nan is not in (0, 1]"},
  };
  for (const PromptCase& c : prompt_cases)
    expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(c.p)); },
                                 {"'prompt'", c.expect});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(Token{0, -1, 5, 0}));
      },
      {"'token'", "index -1"});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(Token{0, 1, -5, 0}));
      },
      {"'token'", "token -5"});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(StageBusy{10, 4, 0.5, 1}));
      },
      {"'stage busy'", "rows 4 is not in [10,"});
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(StageBusy{1, 1, std::nan(""), 1}));
      },
      {"'stage busy'", "busy_s nan is not a finite, non-negative number"});
  LinkTask odd{1, LinkTaskKind::kOpen, "h", "", 6, 1, 0, 1};
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(odd)); },
                               {"'link task'", "message_bytes 6 is not a multiple of 4"});
  struct ProfileCase {
    void (*spoil)(ProfileTask&);
    const char* expect;
  } profile_cases[] = {
      {[](ProfileTask& t) { t.batch = 0; }, "batch 0 is not from 1 to 65536"},
      {[](ProfileTask& t) { t.repeats = 0; }, "warmup or repeats out of range"},
      {[](ProfileTask& t) { t.devices.clear(); }, "it must name 1 to 64 devices"},
      {[](ProfileTask& t) { t.devices[0].threads = 0; }, "device 'cpu': threads or load"},
      {[](ProfileTask& t) { t.devices[0].load = 257; }, "device 'cpu': threads or load"},
      {[](ProfileTask& t) { t.devices[0].backend.clear(); }, "a device without a backend"},
      {[](ProfileTask& t) { t.least_batch = 9; }, "least batch 9 is not from 0 to the batch (8)"},
      {[](ProfileTask& t) { t.least_batch = -1; }, "least batch -1 is not from 0"},
      {[](ProfileTask& t) {
         t.more_batches = {4, 0};
       },
       "more batch 0 is not from 1 to 65536"},
      {[](ProfileTask& t) { t.more_batches = {65537}; }, "more batch 65537 is not from 1"},
      {[](ProfileTask& t) {
         t.more_batches = {4, 8};
       },
       "batch 8 is asked twice"},
      {[](ProfileTask& t) {
         t.more_batches = {4, 2, 4};
       },
       "batch 4 is asked twice"},
  };
  for (const ProfileCase& c : profile_cases) {
    ProfileTask t{"name: m\n", 8, 1, 5, {{"cpu", 1, 0}}, 0, {}};
    c.spoil(t);
    expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(t)); },
                                 {"'profile task'", c.expect});
  }
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(ProfileResult{"{}", -1, {}}));
      },
      {"'profile result'", "cached -1 is out of range"});
  // Devices cached over every batch: at most the devices' limit per profile.
  expectThrowWith<FormatError>(
      [] {
        decodeMessage(encodeMessage(ProfileResult{"{}", 129, {"{}"}}));
      },
      {"'profile result'", "cached 129 is out of range"});
  EXPECT_NO_THROW(decodeMessage(encodeMessage(ProfileResult{"{}", 128, {"{}"}})));
  // What no sender may send: more than 15 other batches, profiles over their limits.
  ProfileTask many{"name: m\n", 100, 1, 5, {{"cpu", 1, 0}}, 0, {}};
  for (int64_t b = 1; b <= 16; ++b) many.more_batches.push_back(b);
  expectThrowWith<InvalidArgument>([&] { encodeMessage(many); },
                                   {"'profile task'", "16 more_batches exceed the limit of 15"});
  const std::string big(kMaxProfileBytes, ' ');
  expectThrowWith<InvalidArgument>(
      [&] {
        encodeMessage(ProfileResult{big, 0, {big, big, "x"}});
      },
      {"'profile result'", "its profiles take 12582913 bytes, over the limit of 12582912"});
  expectThrowWith<InvalidArgument>(
      [&] {
        encodeMessage(ProfileResult{"{}", 0, {big + " "}});
      },
      {"'profile result'", "more of 4194305 bytes exceeds the limit"});
  WeightsChunk past{std::string(64, 'c'), 8, 10, {1, 2, 3}};
  expectThrowWith<FormatError>([&] { decodeMessage(encodeMessage(past)); },
                               {"'weights chunk'", "3 bytes at offset 8 of 10"});
  Ready ready;
  ready.prev.assign(65, "x");
  expectThrowWith<InvalidArgument>([&] { encodeMessage(ready); }, {"65 endpoints"});
}

}  // namespace
}  // namespace tandem::runtime
