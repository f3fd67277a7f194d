// GGUF reading and writing: round trips of every value type, versions 1-3,
// and precise errors (never crashes) on truncated or corrupted files.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "model/gguf.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream is(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(is), {}};
}

// A small file with every metadata type and three tensors.
std::vector<uint8_t> sample_file() {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("u8", {GgufType::U8, GgufType::U32, uint64_t{200}});
  w.set("i8", {GgufType::I8, GgufType::U32, int64_t{-100}});
  w.set("u16", {GgufType::U16, GgufType::U32, uint64_t{60000}});
  w.set("i16", {GgufType::I16, GgufType::U32, int64_t{-30000}});
  w.set("u32", GgufValue::u32(4000000000u));
  w.set("i32", GgufValue::i32(-2000000000));
  w.set("u64", GgufValue::u64(uint64_t{1} << 40));
  w.set("i64", {GgufType::I64, GgufType::U32, int64_t{-(int64_t{1} << 40)}});
  w.set("f32", GgufValue::f32(1.5f));
  w.set("f64", {GgufType::F64, GgufType::U32, 2.25});
  w.set("bool", GgufValue::boolean(true));
  w.set("str", GgufValue::string("héllo"));
  w.set("arr", GgufValue::array(GgufType::String, {GgufValue::string("a"), GgufValue::string("bc")}));
  w.set("nested", GgufValue::array(GgufType::Array, {GgufValue::array(GgufType::I32, {GgufValue::i32(7)})}));
  w.add_tensor("a", DType::F32, {3, 2}, [](uint8_t* d, size_t n) {
    for (size_t i = 0; i < n / 4; ++i) reinterpret_cast<float*>(d)[i] = static_cast<float>(i);
  });
  w.add_tensor("b", DType::Q8_0, {64}, [](uint8_t* d, size_t n) { std::memset(d, 1, n); });
  w.add_tensor("c", DType::F16, {5}, [](uint8_t* d, size_t n) { std::memset(d, 0, n); });
  const auto path = test::temp_path("sample") += ".gguf";
  w.write(path);
  auto bytes = read_bytes(path);
  std::filesystem::remove(path);
  return bytes;
}

TEST(Gguf, WriterRoundTripsEveryValueType) {
  const auto bytes = sample_file();
  const GgufFile f = GgufFile::parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.get_int("i8"), -100);
  EXPECT_EQ(f.get_int("u16"), 60000);
  EXPECT_EQ(f.get_int("i16"), -30000);
  EXPECT_EQ(f.get_int("u32"), 4000000000LL);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(f.get_int("u64"), int64_t{1} << 40);
  EXPECT_EQ(f.get_int("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f.get_float_or("f32"), 1.5);
  EXPECT_EQ(*f.get_float_or("f64"), 2.25);
  EXPECT_TRUE(f.get("bool").as_bool("bool"));
  EXPECT_EQ(f.get_string("str"), "héllo");
  const auto& arr = f.get("arr").as_array("arr");
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[1].as_string("arr"), "bc");
  EXPECT_EQ(f.get("nested").as_array("n")[0].as_array("n")[0].as_int("n"), 7);
  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensor* a = f.find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a->n_bytes, 24u);
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[5], 5.0f);
  EXPECT_EQ(f.find_tensor("b")->n_bytes, 68u);
  EXPECT_EQ(f.find_tensor("c")->n_bytes, 10u);
  EXPECT_EQ((f.find_tensor("c")->data - bytes.data()) % 32, 0);
  // Type mismatches are errors that name the key.
  try {
    f.get_int("str");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'str'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.get("missing"), Error);
}

// Builds an old-format file by hand: version 1 uses 32-bit counts, lengths and dims.
std::vector<uint8_t> v1_file() {
  std::vector<uint8_t> b;
  auto u32 = [&](uint32_t v) {
    b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4);
  };
  auto str = [&](const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  };
  u32(0x46554747), u32(1), u32(1), u32(2);  // magic, version, tensors, kv
  str("name"), u32(8), str("old");
  str("list"), u32(9), u32(4), u32(2), u32(10), u32(20);  // array of u32
  str("w"), u32(2), u32(2), u32(3), u32(0);               // name, n_dims, dims, type F32
  b.resize(b.size() + 8, 0);                              // offset 0 (u64 in every version)
  while (b.size() % 32) b.push_back(0);
  for (int i = 0; i < 6; ++i) {
    float f = static_cast<float>(i) + 0.5f;
    b.insert(b.end(), reinterpret_cast<uint8_t*>(&f), reinterpret_cast<uint8_t*>(&f) + 4);
  }
  return b;
}

TEST(Gguf, ReadsVersion1) {
  const auto bytes = v1_file();
  const GgufFile f = GgufFile::parse(bytes);
  EXPECT_EQ(f.version(), 1u);
  EXPECT_EQ(f.get_string("name"), "old");
  EXPECT_EQ(f.get("list").as_array("list")[1].as_int("list"), 20);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(reinterpret_cast<const float*>(f.tensors()[0].data)[5], 5.5f);
}

TEST(Gguf, ReadsStories260KVersion1) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 1u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 5);
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.get("tokenizer.ggml.tokens").as_array("t").size(), 512u);
}

TEST(Gguf, EveryTruncationIsAPreciseError) {
  for (const auto& bytes : {sample_file(), v1_file()}) {
    // Trailing alignment padding after the last tensor is not needed.
    size_t required = 0;
    const GgufFile whole = GgufFile::parse(bytes);
    for (const GgufTensor& t : whole.tensors())
      required = std::max(required, static_cast<size_t>(t.data + t.n_bytes - bytes.data()));
    for (size_t n = required; n < bytes.size(); ++n) {
      const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
      EXPECT_NO_THROW(GgufFile::parse(cut, "padding cut"));
    }
    for (size_t n = 0; n < required; ++n) {
      const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
      try {
        GgufFile::parse(cut, "cut");
        ADD_FAILURE() << "truncation to " << n << " bytes parsed";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
        const std::string what = e.what();
        EXPECT_TRUE(what.find("truncated") != std::string::npos || what.find("corrupt") != std::string::npos)
            << what;
      }
    }
  }
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  const auto good = sample_file();
  std::mt19937 rng(1);
  int errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto bytes = good;
    const int flips = 1 + iter % 4;
    for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    try {
      const GgufFile f = GgufFile::parse(bytes);
      for (const auto& t : f.tensors()) ASSERT_LE(t.data + t.n_bytes, bytes.data() + bytes.size());
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(Gguf, SpecificCorruptionsAreNamed) {
  auto expect_error = [](std::vector<uint8_t> bytes, const std::string& needle) {
    try {
      GgufFile::parse(bytes, "x.gguf");
      ADD_FAILURE() << "parsed; expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const auto good = v1_file();
  auto bad_magic = good;
  bad_magic[0] = 'X';
  expect_error(bad_magic, "magic");
  auto bad_version = good;
  bad_version[4] = 9;
  expect_error(bad_version, "version 9");
  auto huge_count = good;
  huge_count[12] = 0xff, huge_count[13] = 0xff, huge_count[14] = 0xff;  // kv count
  expect_error(huge_count, "cannot fit");
  auto bad_type = good;
  // The value type of the first key follows magic(4) version(4) counts(8) key(4+4).
  bad_type[24] = 77;
  expect_error(bad_type, "unknown value type 77");
  auto short_data = good;
  short_data.resize(short_data.size() - 4);
  expect_error(short_data, "tensor 'w'");
}

TEST(Gguf, MissingFileIsNotFound) {
  try {
    GgufFile::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache
