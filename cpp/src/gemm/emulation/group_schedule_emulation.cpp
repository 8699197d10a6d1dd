// CPU emulation of the grouped GEMM's device-side schedule (gemm/group.h),
// for checking it without a GPU.
//
// find_row_tile is warp code: 32 lanes scan the groups' tile counts with
// shuffles and a ballot. Here each lane is a host thread, and every warp
// intrinsic is a rendezvous of the 32 threads (write your value, barrier,
// read, barrier), so the code under test is exactly the header's.
//
// For valid offsets every row tile of every group (and of the zero rows
// after the last group) must be found exactly once, by a CTA index below the
// launch's bound; for invalid ones (decreasing, negative, past the rows)
// every answer must stay inside [0, rows). All lanes must agree.
//
// Built and run by tests/cpu/test_host_emulation.py (g++, the CUDA runtime
// headers for common/problem.h; no GPU, no nvcc).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/host_barrier.h"

// ------------------------------------------------------------ the warp ----
namespace {

constexpr int kWarp = 32;

samattn::HostBarrier g_barrier(kWarp);
int g_slots[kWarp];

}  // namespace

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Dim3 threadIdx;

// Every lane publishes `value`; the result is what `lane_of(lane)` published.
template <class LaneOf>
int exchange(int value, LaneOf lane_of) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  g_slots[lane] = value;
  g_barrier.arrive_and_wait();
  const int result = g_slots[lane_of(lane)];
  g_barrier.arrive_and_wait();
  return result;
}

int __shfl_up_sync(unsigned, int value, int delta) {
  return exchange(value, [&](int lane) { return lane >= delta ? lane - delta : lane; });
}
int __shfl_sync(unsigned, int value, int src) {
  return exchange(value, [&](int) { return src; });
}
unsigned __ballot_sync(unsigned, int predicate) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  g_slots[lane] = predicate != 0;
  g_barrier.arrive_and_wait();
  unsigned mask = 0;
  for (int i = 0; i < kWarp; ++i) mask |= static_cast<unsigned>(g_slots[i]) << i;
  g_barrier.arrive_and_wait();
  return mask;
}
int __ffs(unsigned x) { return x == 0 ? 0 : __builtin_ctz(x) + 1; }
template <class T>
T __ldg(const T* p) {
  return *p;
}
using std::max;
using std::min;

#define SAMATTN_GROUP_EMULATION
#include "gemm/group.h"

// ------------------------------------------------------------ the tests ----
namespace {

using samattn::gemm::group::find_row_tile;
using samattn::gemm::group::row_tile_bound;
using samattn::gemm::group::RowTile;

int g_failures = 0;

void fail(const std::string& what) {
  if (g_failures++ < 10) std::printf("    FAIL: %s\n", what.c_str());
}

struct Answer {
  bool found = false;
  RowTile tile{};
};

// Every CTA index of the launch's grid (and a few past it), asked of a warp.
std::vector<Answer> ask_warp(const std::vector<int32_t>& ends, int rows, int block_m, int ctas) {
  std::vector<std::vector<Answer>> by_lane(kWarp, std::vector<Answer>(ctas));
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < kWarp; ++lane) {
    lanes.emplace_back([&, lane] {
      threadIdx.x = static_cast<unsigned>(lane + 64);  // the third warp of a CTA
      for (int linear = 0; linear < ctas; ++linear) {
        Answer& a = by_lane[lane][linear];
        a.found = find_row_tile(ends.data(), static_cast<int>(ends.size()), rows, block_m, linear,
                                &a.tile);
      }
    });
  }
  for (std::thread& t : lanes) t.join();
  for (int lane = 1; lane < kWarp; ++lane) {
    for (int linear = 0; linear < ctas; ++linear) {
      const Answer &a = by_lane[0][linear], &b = by_lane[lane][linear];
      if (a.found != b.found ||
          (a.found &&
           (a.tile.group != b.tile.group || a.tile.tile != b.tile.tile ||
            a.tile.rows.begin != b.tile.rows.begin || a.tile.rows.end != b.tile.rows.end))) {
        fail("lane " + std::to_string(lane) + " disagrees with lane 0 at CTA " +
             std::to_string(linear));
        return by_lane[0];
      }
    }
  }
  return by_lane[0];
}

// Valid ends: each group's tiles exactly once, below the bound, rows as the
// ends say.
void check_valid(const std::string& name, const std::vector<int32_t>& ends, int rows, int block_m) {
  const int groups = static_cast<int>(ends.size());
  const int bound = static_cast<int>(row_tile_bound(rows, groups, block_m));
  const std::vector<Answer> answers = ask_warp(ends, rows, block_m, bound + 3);
  std::vector<int> begins(groups + 1), finishes(groups + 1);
  for (int g = 0; g <= groups; ++g) {
    begins[g] = g == 0 ? 0 : ends[g - 1];
    finishes[g] = g < groups ? ends[g] : rows;
  }
  std::vector<std::vector<int>> seen(groups + 1);
  for (int g = 0; g <= groups; ++g) {
    seen[g].assign((finishes[g] - begins[g] + block_m - 1) / block_m, 0);
  }
  int found = 0;
  for (int linear = 0; linear < bound + 3; ++linear) {
    const Answer& a = answers[linear];
    if (!a.found) continue;
    ++found;
    const int g = a.tile.group;
    if (linear >= bound) fail(name + ": CTA " + std::to_string(linear) + " past the bound");
    if (g < 0 || g > groups) {
      fail(name + ": group " + std::to_string(g) + " out of range");
      continue;
    }
    if (a.tile.rows.begin != begins[g] || a.tile.rows.end != finishes[g]) {
      fail(name + ": group " + std::to_string(g) + " rows [" + std::to_string(a.tile.rows.begin) +
           ", " + std::to_string(a.tile.rows.end) + ") instead of [" + std::to_string(begins[g]) +
           ", " + std::to_string(finishes[g]) + ")");
    }
    if (a.tile.tile < 0 || a.tile.tile >= static_cast<int>(seen[g].size())) {
      fail(name + ": group " + std::to_string(g) + " tile " + std::to_string(a.tile.tile) +
           " out of range");
      continue;
    }
    ++seen[g][a.tile.tile];
  }
  int expected = 0;
  for (int g = 0; g <= groups; ++g) {
    for (size_t t = 0; t < seen[g].size(); ++t) {
      ++expected;
      if (seen[g][t] != 1) {
        fail(name + ": group " + std::to_string(g) + " tile " + std::to_string(t) + " found " +
             std::to_string(seen[g][t]) + " times");
      }
    }
  }
  if (found != expected)
    fail(name + ": " + std::to_string(found) + " tiles found, expected " +
         std::to_string(expected));
}

// Invalid ends: any answer, but inside the rows.
void check_inside(const std::string& name, const std::vector<int32_t>& ends, int rows,
                  int block_m) {
  const int groups = static_cast<int>(ends.size());
  const int bound = static_cast<int>(row_tile_bound(rows, groups, block_m));
  for (const Answer& a : ask_warp(ends, rows, block_m, bound)) {
    if (!a.found) continue;
    const RowTile& t = a.tile;
    const bool inside = t.group >= 0 && t.group <= groups && 0 <= t.rows.begin &&
                        t.rows.begin <= t.rows.end && t.rows.end <= rows && t.tile >= 0 &&
                        t.tile * block_m < t.rows.end - t.rows.begin;
    if (!inside) fail(name + ": a tile outside the rows");
  }
}

std::vector<int32_t> cumulative(const std::vector<int>& counts) {
  std::vector<int32_t> ends;
  int32_t sum = 0;
  for (int c : counts) ends.push_back(sum += c);
  return ends;
}

}  // namespace

int main() {
  std::mt19937 rng(20261127);
  int cases = 0;
  const auto run_valid = [&](const std::string& name, const std::vector<int>& counts, int tail,
                             int block_m) {
    const std::vector<int32_t> ends = cumulative(counts);
    check_valid(name, ends, (ends.empty() ? 0 : ends.back()) + tail, block_m);
    ++cases;
  };
  run_valid("one group", {300}, 0, 128);
  run_valid("one group and a tail", {300}, 77, 128);
  run_valid("all empty", {0, 0, 0}, 0, 64);
  run_valid("empty groups and a tail", {0, 0, 0, 5}, 200, 64);
  run_valid("exact tiles", {128, 256, 128}, 0, 128);
  for (int groups : {2, 31, 32, 33, 65, 100}) {
    for (int block_m : {64, 128}) {
      std::vector<int> counts(groups);
      for (int& c : counts) c = (rng() % 4 == 0) ? 0 : static_cast<int>(rng() % 200);
      const int tail = (groups % 2) ? static_cast<int>(rng() % 150) : 0;
      run_valid("random " + std::to_string(groups) + " groups, block " + std::to_string(block_m),
                counts, tail, block_m);
    }
  }
  const auto run_inside = [&](const std::string& name, const std::vector<int32_t>& ends, int rows) {
    check_inside(name, ends, rows, 128);
    ++cases;
  };
  run_inside("decreasing", {500, 100, 300, 900}, 1000);
  run_inside("negative", {-40, -1, 20, 30}, 64);
  run_inside("past the rows", {100, 5000, 2147483647}, 700);
  run_inside("all past", {900, 900, 900}, 300);
  run_inside("no rows", {0, 3, 1}, 0);
  std::printf("%d cases, %d failures\n", cases, g_failures);
  if (g_failures != 0) return 1;
  std::printf("all passed\n");
  return 0;
}
