// random.cc: seeded, reproducible random numbers.
//
// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11) is a counter-based generator: word i of the stream is a pure function of
// (seed, i). That makes the generator's whole state two integers (seed, offset),
// trivially checkpointed, and makes the values independent of how they are
// consumed. Values are produced on the host and copied to the target device, so
// a CUDA tensor gets exactly the numbers a CPU tensor would.
//
// Conversions: uniform floats use the top 24 bits of a word (exact in float32,
// never 1.0; a value that rounds to the upper bound in a narrower dtype is mapped to
// the lower bound, as PyTorch does); normals use Box-Muller on pairs of uniforms.
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "tensor/ops.h"

namespace ringtrain {

namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// One Philox 4x32 block: 10 rounds of multiply-xor mixing of the counter under the key.
std::array<uint32_t, 4> philox_block(uint64_t counter, uint64_t seed) {
  std::array<uint32_t, 4> c = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return c;
}

double word_to_unit(uint32_t word) { return static_cast<double>(word >> 8) * (1.0 / 16777216.0); }

// `value` as a tensor of `dtype` stores it (doubles reach half types through float, as copy_ does).
double stored_as(DType dtype, double value) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(value);
    case DType::kFloat16: return static_cast<float>(Half(static_cast<float>(value)));
    case DType::kBFloat16: return static_cast<float>(BFloat16(static_cast<float>(value)));
    default: return value;  // float64 keeps it; integer dtypes truncate toward low anyway
  }
}

// Writes host values into t (any device/dtype/strides).
void assign(Tensor& t, const std::vector<double>& values) {
  t.copy_(Tensor::from_vector(values, t.shape()));
}
}  // namespace

void Generator::next_uint32(uint32_t* out, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint64_t block = offset_ / 4;
    size_t lane = offset_ % 4;
    std::array<uint32_t, 4> words = philox_block(block, seed_);
    for (; lane < 4 && i < n; ++lane, ++i, ++offset_) out[i] = words[lane];
  }
}

double Generator::next_uniform() {
  uint32_t word;
  next_uint32(&word, 1);
  return word_to_unit(word);
}

namespace {
thread_local Generator* thread_default_generator = nullptr;  // set by ScopedDefaultGenerator
}  // namespace

Generator& default_generator() {
  static Generator generator(0);
  return thread_default_generator != nullptr ? *thread_default_generator : generator;
}

ScopedDefaultGenerator::ScopedDefaultGenerator(Generator& gen) : previous_(thread_default_generator) {
  thread_default_generator = &gen;
}
ScopedDefaultGenerator::~ScopedDefaultGenerator() { thread_default_generator = previous_; }

Tensor& uniform_(Tensor& t, double low, double high, Generator& gen) {
  // Non-finite bounds, or a range whose width overflows (-1e308, 1e308), would fill the
  // tensor with inf/NaN (low + inf * u); as in PyTorch, they are errors.
  RT_CHECK(std::isfinite(low) && std::isfinite(high), "uniform_: the bounds must be finite, got low ",
           low, " and high ", high, "; pass finite bounds (for a very wide range, scale a narrower draw)");
  RT_CHECK(low <= high, "uniform_: low ", low, " is greater than high ", high);
  RT_CHECK(std::isfinite(high - low), "uniform_: the range [", low, ", ", high,
           ") is too wide: high - low overflows to inf; narrow the bounds");
  if (is_floating_point(t.dtype())) {
    RT_CHECK(std::isfinite(stored_as(t.dtype(), low)) && std::isfinite(stored_as(t.dtype(), high)),
             "uniform_: the bounds low ", low, " and high ", high, " are out of range for ",
             t.describe(), " (they would be stored as inf); narrow them or use a wider dtype");
  }
  std::vector<uint32_t> words(static_cast<size_t>(t.numel()));
  gen.next_uint32(words.data(), words.size());
  std::vector<double> values(words.size());
  for (size_t i = 0; i < words.size(); ++i) {
    values[i] = low + (high - low) * word_to_unit(words[i]);
    // The draw is below `high`, but rounding it to the tensor's dtype can land on `high`
    // (about 0.2% of bfloat16 rand() values would be 1.0). As PyTorch does, such a value
    // becomes `low`, so every stored value lies in [low, high).
    if (low < high && stored_as(t.dtype(), values[i]) >= high) values[i] = low;
  }
  assign(t, values);
  return t;
}

Tensor& normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  RT_CHECK(stddev >= 0, "normal_: stddev must be non-negative, got ", stddev);
  size_t n = static_cast<size_t>(t.numel());
  std::vector<uint32_t> words(n + (n % 2));
  gen.next_uint32(words.data(), words.size());
  std::vector<double> values(words.size());
  for (size_t i = 0; i < words.size(); i += 2) {
    double u1 = 1.0 - word_to_unit(words[i]);  // (0, 1]: log is finite
    double u2 = word_to_unit(words[i + 1]);
    double radius = std::sqrt(-2.0 * std::log(u1));
    values[i] = mean + stddev * radius * std::cos(2.0 * std::numbers::pi * u2);
    values[i + 1] = mean + stddev * radius * std::sin(2.0 * std::numbers::pi * u2);
  }
  values.resize(n);
  assign(t, values);
  return t;
}

Tensor& bernoulli_(Tensor& t, double p, Generator& gen) {
  RT_CHECK(p >= 0 && p <= 1, "bernoulli_: p must be in [0, 1], got ", p);
  std::vector<uint32_t> words(static_cast<size_t>(t.numel()));
  gen.next_uint32(words.data(), words.size());
  std::vector<double> values(words.size());
  for (size_t i = 0; i < words.size(); ++i) values[i] = word_to_unit(words[i]) < p ? 1.0 : 0.0;
  assign(t, values);
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  return uniform_(t, 0.0, 1.0, gen);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  return normal_(t, 0.0, 1.0, gen);
}

Tensor randperm(int64_t n, Generator& gen) {
  RT_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  // Fisher-Yates, drawing j uniformly from [0, i] with a 64-bit multiply-shift.
  for (int64_t i = n - 1; i > 0; --i) {
    uint32_t words[2];
    gen.next_uint32(words, 2);
    uint64_t r = (static_cast<uint64_t>(words[0]) << 32) | words[1];
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return Tensor::from_vector(perm, {n});
}

}  // namespace ringtrain
