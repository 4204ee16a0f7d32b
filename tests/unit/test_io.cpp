// SPDX-License-Identifier: BSD-3-Clause
// Deck parsing (strict keys, line numbers, --set), token files and SHA-256.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "analysis/blocks.hpp"
#include "analysis/landscape.hpp"
#include "analysis/team.hpp"
#include "core/deal.hpp"
#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/checkpoint.hpp"
#include "io/deck.hpp"
#include "io/hdf5.hpp"
#include "model/layout.hpp"
#include "io/results.hpp"
#include "io/tokens.hpp"

using namespace gnh;
using Catch::Matchers::Contains;

namespace {
const char* kDeck = R"([run]
output = "out.h5"
[checkpoints]
paths = ["a/*.h5", "b.h5"]
[data]
context = 16
seen = { path = "train.bin", dtype = "uint16" }
unseen = { path = "val.bin" }
[analysis]
directions = 8
seed = 99
)";

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_deck(text, "deck.toml", "/runs", sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a valid deck parses with defaults and resolved paths", "[deck]") {
  const Deck d = parse_deck(kDeck, "deck.toml", "/runs");
  REQUIRE(d.output == "out.h5");
  REQUIRE(d.resolve(d.output) == "/runs/out.h5");
  REQUIRE(d.resolve("/abs/x") == "/abs/x");
  REQUIRE(d.checkpoint_paths == std::vector<std::string>{"a/*.h5", "b.h5"});
  REQUIRE(d.analysis.context == 16);
  REQUIRE(d.cases.size() == 2);
  REQUIRE(d.cases[1].name == "unseen");
  REQUIRE(d.cases[1].dtype == "uint16");
  REQUIRE(d.analysis.directions == 8);
  REQUIRE(d.analysis.seed == 99);
  REQUIRE(d.analysis.grad_microbatch == 32);  // default
  REQUIRE(d.analysis.precision == Precision::fp32);
  REQUIRE(d.name == "deck");  // from the file name
  REQUIRE_THAT(d.effective_text, Contains("directions = 8"));
}

TEST_CASE("deck errors name the line and the key", "[deck]") {
  std::string text = kDeck;
  text.replace(text.find("directions"), 10, "diretions");
  REQUIRE_THAT(error_of(text), Contains("deck.toml:10:") && Contains("unknown key 'analysis.diretions'") &&
                                   Contains("did you mean 'directions'"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[extra]\nx = 1\n"),
               Contains("deck.toml:12:") && Contains("unknown key 'extra'"));
  std::string wrong_type = kDeck;
  wrong_type.replace(wrong_type.find("context = 16"), 12, "context = \"16\"");
  REQUIRE_THAT(error_of(wrong_type), Contains("deck.toml:6:") && Contains("data.context must be an integer"));
  std::string range = kDeck;
  range.replace(range.find("directions = 8"), 14, "directions = -1");
  REQUIRE_THAT(error_of(range), Contains("deck.toml:10:") && Contains("out of range"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[precision]\npolicy = \"fp16\"\n"),
               Contains("deck.toml:13:") && Contains("precision.policy = \"fp16\" is not one of"));
  REQUIRE_THAT(error_of("[run]\noutput = \"x\"\n"), Contains("missing required section [checkpoints]"));
  REQUIRE_THAT(error_of("[run\n"), Contains("deck.toml:1: TOML syntax error"));
  std::string dtype = kDeck;
  dtype.replace(dtype.find("dtype = \"uint16\""), 16, "dtype = \"int8\"");
  REQUIRE_THAT(error_of(dtype), Contains("deck.toml:7:") && Contains("data.seen.dtype"));
}

TEST_CASE("deck: --set overrides keys and is named in errors", "[deck]") {
  const Deck d = parse_deck(kDeck, "deck.toml", "/runs",
                            {"analysis.directions=3", "precision.policy=fp64", "data.seen.path=other.bin",
                             "parallel.ranks_per_checkpoint=2"});
  REQUIRE(d.analysis.directions == 3);
  REQUIRE(d.analysis.precision == Precision::fp64);  // a bare word is taken as a string
  REQUIRE(d.cases[0].path == "other.bin");
  REQUIRE(d.ranks_per_checkpoint == 2);
  REQUIRE_THAT(error_of(kDeck, {"analysis.directions=x1"}),
               Contains("--set analysis.directions=x1") && Contains("must be an integer"));
  REQUIRE_THAT(error_of(kDeck, {"analysis.nope=1"}),
               Contains("--set analysis.nope=1") && Contains("unknown key 'analysis.nope'"));
  REQUIRE_THAT(error_of(kDeck, {"novalue"}), Contains("expected key=value"));
  REQUIRE_THAT(error_of(kDeck, {"data.context.x=1"}), Contains("'context' is not a table"));
}

TEST_CASE("deck: parallel.parameter_shards divides the team", "[deck]") {
  REQUIRE(parse_deck(kDeck, "deck.toml", "/runs").analysis.parameter_shards == 1);
  const Deck d =
      parse_deck(kDeck, "deck.toml", "/runs", {"parallel.ranks_per_checkpoint=6", "parallel.parameter_shards=3"});
  REQUIRE(d.analysis.parameter_shards == 3);
  REQUIRE_THAT(error_of(kDeck, {"parallel.ranks_per_checkpoint=4", "parallel.parameter_shards=3"}),
               Contains("--set parallel.parameter_shards=3") &&
                   Contains("parallel.parameter_shards = 3 does not divide parallel.ranks_per_checkpoint = 4"));
  REQUIRE_THAT(error_of(kDeck, {"parallel.parameter_shards=0"}), Contains("parallel.parameter_shards"));
}

TEST_CASE("shard layout: slices cut at the dot product's chunks, balanced, covering the order", "[deck]") {
  for (const auto& [P, R] : {std::pair<index_t, int>{34208, 2}, {34208, 3}, {4096 * 7 + 5, 4}, {100, 3}}) {
    const ShardLayout l(P, R);
    REQUIRE(l.begin(0) == 0);
    REQUIRE(l.end(R - 1) == P);
    index_t most = 0, least = P;
    for (int r = 0; r < R; ++r) {
      REQUIRE(l.begin(r) <= l.end(r));
      if (r + 1 < R) REQUIRE((l.end(r) % ShardLayout::kChunk == 0 || l.end(r) == P));
      most = std::max(most, l.size(r));
      least = std::min(least, l.size(r));
    }
    REQUIRE(most - least <= ShardLayout::kChunk + P % ShardLayout::kChunk);  // at most a chunk apart, less the tail
    REQUIRE(l.largest() == most);
  }
}

TEST_CASE("token files: widths, vocabulary check with offsets, digest", "[tokens]") {
  const std::string path = "gnh_test_tokens.bin";
  {
    std::ofstream f(path, std::ios::binary);
    const unsigned char bytes[] = {1, 0, 2, 1, 7, 0};  // uint16 LE: 1, 258, 7
    f.write(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  }
  const TokenFile t = read_tokens(path, "uint16", "", 300);
  REQUIRE(t.ids == std::vector<std::int32_t>{1, 258, 7});
  REQUIRE(t.sha256 == sha256_file(path));
  try {
    read_tokens(path, "uint16", "", 200);
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE_THAT(e.what(),
                 Contains("gnh_test_tokens.bin") && Contains("token id 258 at offset 1") && Contains("vocab_size 200"));
  }
  try {
    read_tokens(path, "uint32", "", 1 << 30);
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE_THAT(e.what(), Contains("not a multiple of 4"));
  }
  REQUIRE_THROWS_WITH(read_tokens("no/such/file.bin", "uint16", "", 10), Contains("no/such/file.bin"));
  // A range alone, its offsets those of the source; beyond the end, refused.
  const TokenSource src = open_token_source(path, "bin", "uint16", "");
  REQUIRE(src.count == 3);
  REQUIRE(read_token_range(src, 2, 1, 300) == std::vector<std::int32_t>{7});
  REQUIRE(read_token_range(src, 2, 1, 8) == std::vector<std::int32_t>{7});  // 258 is not read
  REQUIRE_THROWS_WITH(read_token_range(src, 1, 2, 200), Contains("token id 258 at offset 1"));
  REQUIRE_THROWS_WITH(read_token_range(src, 2, 2, 300), Contains("tokens [2, 4) asked for, the source holds 3"));
  // The digest of ids as little-endian int32, whatever held them.
  const std::int32_t ids[] = {1, 258, 7};
  const unsigned char le[] = {1, 0, 0, 0, 2, 1, 0, 0, 7, 0, 0, 0};
  REQUIRE(tokens_sha256(ids, 3) == sha256_hex(std::string(reinterpret_cast<const char*>(le), sizeof(le))));
  std::remove(path.c_str());
  // An HDF5 dataset's range by hyperslab.
  const std::string h5path = "gnh_test_tokens.h5";
  {
    h5::File f = h5::File::create(h5path);
    const std::vector<std::int64_t> v = {3, 4, 5, 6, 7};
    h5::write_dataset(f.id(), "ids", v, {5});
    f.close();
  }
  const TokenSource hs = open_token_source(h5path, "hdf5", "hdf5", "ids");
  REQUIRE(hs.count == 5);
  REQUIRE(read_token_range(hs, 1, 3, 10) == std::vector<std::int32_t>{4, 5, 6});
  REQUIRE_THROWS_WITH(read_token_range(hs, 3, 2, 7), Contains("token id 7 at offset 4"));
  std::remove(h5path.c_str());
}

TEST_CASE("sha256 matches the FIPS 180-4 examples", "[core]") {
  REQUIRE(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  REQUIRE(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  REQUIRE(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  REQUIRE(sha256_hex(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("an atomic write whose rename fails says why and leaves no temporary", "[results]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gnh-test-io-" + std::to_string(::getpid()));
  fs::create_directories(dir / "target.h5" / "occupied");  // rename() cannot replace a non-empty directory
  std::string message;
  try {
    write_atomically((dir / "target.h5").string(), [](const std::string& tmp) { std::ofstream(tmp) << "x"; });
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains("target.h5: cannot rename"));
  CHECK_THAT(message, Contains(std::strerror(EISDIR)));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);  // the temporary file is gone
  fs::remove_all(dir);
}

TEST_CASE("a --set that creates a section is blamed, and broken TOML in a --set is an error", "[deck]") {
  CHECK_THAT(error_of(kDeck, {"foo.bar=1"}), Contains("--set foo.bar=1: unknown key 'foo'"));
  CHECK_THAT(error_of(kDeck, {"checkpoints.paths=[\"a\","}), Contains("is not valid TOML"));
  CHECK_THAT(error_of(kDeck, {"run.name={ x"}), Contains("is not valid TOML"));
  CHECK(error_of(kDeck, {"precision.policy=bf16-amp"}).empty());  // a bare word is a string
  CHECK(error_of(kDeck, {"run.output=results/x.h5"}).empty());
}

TEST_CASE("every [analysis] key of the table is read, range-checked and typed", "[deck]") {
  // The table (analysis/settings.hpp) is the only list of keys: each one is
  // accepted, an integer below its lowest value is refused naming the key, an
  // enumeration takes only its names, and a boolean only true or false.
  const Deck defaults = parse_deck(kDeck, "deck.toml", "/runs");
  for_each_analysis_key(defaults.analysis, [&](const AnalysisKey& k, const auto& v) {
    using V = std::decay_t<decltype(v)>;
    const std::string key = std::string("analysis.") + k.name;
    CAPTURE(key);
    if constexpr (std::is_enum_v<V>) {
      for (const auto& name : curvature_method_names()) {
        const Deck d = parse_deck(kDeck, "deck.toml", "/runs", {key + "=" + name});
        REQUIRE(to_string(d.analysis.curvature_method) == name);
      }
      REQUIRE_THAT(error_of(kDeck, {key + "=newton"}), Contains(key) && Contains("is not one of"));
    } else if constexpr (std::is_same_v<V, bool>) {
      for (const bool value : {false, true}) {
        const Deck d = parse_deck(kDeck, "deck.toml", "/runs", {key + "=" + (value ? "true" : "false")});
        bool got = !value;
        for_each_analysis_key(d.analysis, [&](const AnalysisKey& k2, const auto& v2) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v2)>, bool>)
            if (std::string(k2.name) == k.name) got = v2;
        });
        REQUIRE(got == value);
      }
      REQUIRE_THAT(error_of(kDeck, {key + "=3"}), Contains(key));
    } else {
      const Deck d = parse_deck(kDeck, "deck.toml", "/runs", {key + "=" + std::to_string(k.lowest)});
      REQUIRE(std::int64_t(v) >= k.lowest);
      std::int64_t got = -1;
      for_each_analysis_key(d.analysis, [&](const AnalysisKey& k2, const auto& v2) {
        if constexpr (!std::is_enum_v<std::decay_t<decltype(v2)>>)
          if (std::string(k2.name) == k.name) got = std::int64_t(v2);
      });
      REQUIRE(got == k.lowest);
      REQUIRE_THAT(error_of(kDeck, {key + "=" + std::to_string(k.lowest - 1)}),
                   Contains(key) && Contains("out of range"));
    }
  });
}

TEST_CASE("one dealing rule: item i to part i mod parts, every item once", "[deal]") {
  for (int parts : {1, 2, 3, 7})
    for (index_t items : {index_t(0), index_t(1), index_t(5), index_t(22)}) {
      std::vector<int> seen(static_cast<std::size_t>(items), 0);
      for (int part = 0; part < parts; ++part)
        for (const index_t i : dealt_share(items, parts, part)) {
          REQUIRE(dealt_to(i, parts) == part);
          ++seen[static_cast<std::size_t>(i)];
        }
      for (int n : seen) REQUIRE(n == 1);
    }
}

TEST_CASE("[curvature]: its keys are read and typed; the spectrum needs forward-over-reverse", "[deck]") {
  const Deck none = parse_deck(kDeck, "deck.toml", "/runs");
  REQUIRE_FALSE(none.analysis.curvature.any());
  const Deck d = parse_deck(std::string(kDeck) + "[curvature]\nblocks = true\nupdate = false\nlanczos_steps = 0\n",
                            "deck.toml", "/runs");
  REQUIRE(d.analysis.curvature.blocks);
  REQUIRE_FALSE(d.analysis.curvature.diagonal);
  // H v exists only under forward-over-reverse.
  REQUIRE_FALSE(d.analysis.keeps_hv());
  const Deck f = parse_deck(kDeck, "deck.toml", "/runs",
                            {"curvature.diagonal=true", "analysis.curvature_method=forward-over-reverse"});
  REQUIRE(f.analysis.curvature.diagonal);
  REQUIRE(f.analysis.keeps_hv());
  const Deck p = parse_deck(kDeck, "deck.toml", "/runs", {"curvature.preconditioned=true"});
  REQUIRE(p.analysis.curvature.preconditioned);
  REQUIRE_FALSE(p.analysis.keeps_hv());  // quadratic forms only: either method
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nblocks = 1\n"),
               Contains("deck.toml:13:") && Contains("curvature.blocks must be true or false"));
  REQUIRE(
      parse_deck(std::string(kDeck) + "[curvature]\nupdate = true\n", "deck.toml", "/runs").analysis.curvature.update);
  // The spectrum (SPEC §10): its keys typed and ranged, and refused by line
  // under second-order forward, which forms no H v.
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nlanczos_steps = 20\n"),
               Contains("deck.toml:13:") && Contains("curvature_method = \"forward-over-reverse\""));
  const Deck l = parse_deck(std::string(kDeck) +
                                "[curvature]\nlanczos_steps = 20\nlanczos_chains = 3\n"
                                "lanczos_operator = \"PHP\"\nlanczos_tolerance = 1e-8\ntop_eigenvalues = 4\n",
                            "deck.toml", "/runs", {"analysis.curvature_method=forward-over-reverse"});
  REQUIRE(l.analysis.curvature.lanczos_steps == 20);
  REQUIRE(l.analysis.curvature.lanczos_chains == 3);
  REQUIRE(l.analysis.curvature.lanczos_php);
  REQUIRE(l.analysis.curvature.lanczos_tolerance == 1e-8);
  REQUIRE(l.analysis.curvature.top_eigenvalues == 4);
  REQUIRE(l.analysis.curvature.any());
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nlanczos_tolerance = -1.0\n"),
               Contains("deck.toml:13:") && Contains("out of range"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nlanczos_tolerance = \"small\"\n"),
               Contains("deck.toml:13:") && Contains("must be a number"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nlanczos_operator = \"Hv\"\n"),
               Contains("deck.toml:13:") && Contains("lanczos_operator"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nblock = true\n"), Contains("unknown key 'curvature.block'"));
  // The Gauss-Newton operator: its values, and "ggn" refused beside the
  // statistics whose products would be the Hessian's.
  REQUIRE(parse_deck(std::string(kDeck) + "[curvature]\noperator = \"both\"\n", "deck.toml", "/runs")
              .analysis.curvature.op == OperatorChoice::both);
  const Deck g = parse_deck(std::string(kDeck) + "[curvature]\noperator = \"ggn\"\n", "deck.toml", "/runs");
  REQUIRE(g.analysis.curvature.op == OperatorChoice::ggn);
  REQUIRE(g.analysis.curvature.any());
  REQUIRE(!parse_deck(kDeck, "deck.toml", "/runs").analysis.curvature.gauss_newton());
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\noperator = \"gauss-newton\"\n"),
               Contains("deck.toml:13:") && Contains("operator"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nblocks = true\noperator = \"ggn\"\n"),
               Contains("deck.toml:14:") && Contains("set curvature.operator = \"both\""));
  // Eigenvectors: the first chain's Ritz vectors, so they need the spectrum
  // and at most its steps.
  REQUIRE(parse_deck(std::string(kDeck) + "[curvature]\nlanczos_steps = 20\neigenvectors = 4\n", "deck.toml", "/runs",
                     {"analysis.curvature_method=forward-over-reverse"})
              .analysis.curvature.eigenvectors == 4);
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\neigenvectors = 4\n"),
               Contains("deck.toml:13:") && Contains("set curvature.lanczos_steps"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nlanczos_steps = 3\neigenvectors = 4\n",
                        {"analysis.curvature_method=forward-over-reverse"}),
               Contains("deck.toml:14:") && Contains("more than the Ritz vectors"));
  // Per-layer spectra: "layer" or "none", and only with the spectrum's steps.
  REQUIRE(parse_deck(std::string(kDeck) + "[curvature]\nlanczos_steps = 20\nspectrum_blocks = \"layer\"\n", "deck.toml",
                     "/runs", {"analysis.curvature_method=forward-over-reverse"})
              .analysis.curvature.layer_spectra);
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nspectrum_blocks = \"layer\"\n"),
               Contains("deck.toml:13:") && Contains("set curvature.lanczos_steps"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[curvature]\nlanczos_steps = 20\nspectrum_blocks = \"tensor\"\n",
                        {"analysis.curvature_method=forward-over-reverse"}),
               Contains("deck.toml:14:") && Contains("spectrum_blocks"));
}

TEST_CASE("[checkpoints] learning_rates: globs and rates > 0", "[deck]") {
  std::string text = kDeck;
  const std::string at = "[checkpoints]\n";
  text.replace(text.find(at), at.size(), at + "learning_rates = { \"ckpt_*\" = 6e-4, \"final.h5\" = 1 }\n");
  const Deck d = parse_deck(text, "deck.toml", "/runs");
  REQUIRE(d.checkpoint_learning_rates.size() == 2);
  REQUIRE(d.checkpoint_learning_rates[0].second == 6e-4);
  REQUIRE(d.checkpoint_learning_rates[1].second == 1.0);
  for (const char* bad : {"{ \"a\" = -1.0 }", "{ \"a\" = \"fast\" }", "6e-4"}) {
    std::string t = kDeck;
    t.replace(t.find(at), at.size(), at + "learning_rates = " + bad + "\n");
    REQUIRE_THAT(error_of(t), Contains("deck.toml:") && Contains("checkpoints.learning_rates"));
  }
}

TEST_CASE("[landscape]: its directions, grids and what each direction needs", "[deck][landscape]") {
  const std::string spectrum =
      std::string(kDeck) + "[curvature]\nlanczos_steps = 20\neigenvectors = 2\nupdate = true\n";
  const std::vector<std::string> fr = {"analysis.curvature_method=forward-over-reverse"};
  const Deck d = parse_deck(spectrum +
                                "[landscape]\ndirections = [\"gradient\", \"update\", \"eigenvector:2\", "
                                "\"random:1\"]\nplane = [\"random:1\", \"random:3\"]\npoints = 7\nrange = 0.5\n",
                            "deck.toml", "/runs", fr);
  const LandscapeSettings& ls = d.analysis.landscape;
  REQUIRE(ls.directions.size() == 4);
  REQUIRE(ls.directions[2] == LandscapeDirection{LandscapeKind::eigenvector, 2});
  REQUIRE(ls.directions[3].name() == "random:1");
  REQUIRE(ls.points == 7);
  REQUIRE(ls.range == 0.5);
  REQUIRE(ls.plane_points == 11);
  REQUIRE(ls.seed == d.analysis.seed);
  REQUIRE(ls.used().size() == 5);  // random:1 once, random:3 from the plane
  REQUIRE(ls.random_count() == 2);
  REQUIRE(ls.top_eigenvector() == 2);
  REQUIRE(ls.forward_passes() == 4 * 7 + 11 * 11);
  REQUIRE(landscape_grid(5, 2.0) == std::vector<double>{-2.0, -1.0, 0.0, 1.0, 2.0});
  // Each refusal names the line and what to set.
  const std::string l = "[landscape]\ndirections = ";
  REQUIRE_THAT(error_of(spectrum + l + "[\"eigenvector:3\"]\n", fr),
               Contains("deck.toml:17:") && Contains("set curvature.eigenvectors to at least 3"));
  REQUIRE_THAT(error_of(std::string(kDeck) + l + "[\"update\"]\n"), Contains("set curvature.update = true"));
  REQUIRE_THAT(error_of(std::string(kDeck) + l + "[\"random:0\"]\n"), Contains("is not a direction"));
  REQUIRE_THAT(error_of(std::string(kDeck) + l + "[\"gradient\", \"gradient\"]\n"), Contains("twice"));
  REQUIRE_THAT(error_of(std::string(kDeck) + l + "[\"gradient\"]\npoints = 4\n"),
               Contains("landscape.points = 4 is even"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[landscape]\nplane = [\"gradient\"]\n"), Contains("a plane takes two"));
  REQUIRE_THAT(error_of(std::string(kDeck) + "[landscape]\npoints = 5\n"), Contains("names no direction"));
  REQUIRE_THAT(error_of(spectrum + "lanczos_operator = \"PHP\"\n" + l + "[\"eigenvector:1\"]\n", fr),
               Contains("takes the Hessian's Ritz vectors"));
}

TEST_CASE("the tensor and layer partitions of SPEC §10 tile the flat vector", "[blocks]") {
  for (bool bias : {true, false})
    for (bool tied : {true, false}) {
      ModelConfig cfg;
      cfg.n_layer = 3;
      cfg.n_head = 2;
      cfg.n_embd = 8;
      cfg.block_size = 16;
      cfg.vocab_size = 11;
      cfg.bias = bias;
      cfg.tie_embeddings = tied;
      const ParamLayout L(cfg);
      const auto parts = parameter_partitions(L);
      REQUIRE(parts.size() == 2);
      const Partition& t = parts[0];
      const Partition& l = parts[1];
      CAPTURE(bias, tied);
      REQUIRE(t.name == "tensor");
      REQUIRE(t.names.size() == L.tensors().size());
      REQUIRE(t.offsets.size() == t.names.size() + 1);
      for (std::size_t i = 0; i < t.names.size(); ++i) {
        REQUIRE(t.names[i] == L.tensors()[i].name);
        REQUIRE(t.offsets[i + 1] - t.offsets[i] == L.tensors()[i].size);
      }
      REQUIRE(l.name == "layer");
      REQUIRE(l.names == std::vector<std::string>{"embed", "h.0", "h.1", "h.2", "head"});
      REQUIRE(l.offsets.front() == 0);
      REQUIRE(l.offsets.back() == L.size());
      const std::int64_t C = 8, V = 11, T = 16;
      REQUIRE(l.offsets[1] == (V + T) * C);  // wte + wpe
      // head: ln_f (weight, and bias when present), and lm_head when untied.
      REQUIRE(l.offsets[5] - l.offsets[4] == C * (bias ? 2 : 1) + (tied ? 0 : V * C));
      // Every layer block is a union of whole tensor blocks.
      for (std::int64_t o : l.offsets) REQUIRE(std::count(t.offsets.begin(), t.offsets.end(), o) == 1);
    }
}

namespace {
// A nanoGPT checkpoint of `c` holding `flat` (canonical order) as gnh-convert
// writes one, with the param_sha256 of `hashed`.
void write_checkpoint(const std::string& path, const ModelConfig& c, const std::vector<float>& flat,
                      const std::vector<float>& hashed) {
  h5::File f = h5::File::create(path);
  h5::write_attr(f.id(), "format", std::string("gnh-checkpoint"));
  h5::write_attr(f.id(), "format_version", std::int64_t(1));
  h5::write_attr(f.id(), "param_sha256", params_sha256(hashed));
  h5::Handle cfg = h5::create_group(f.id(), "config", path);
  for (const auto& [key, v] : std::vector<std::pair<std::string, std::int64_t>>{{"n_layer", c.n_layer},
                                                                                {"n_head", c.n_head},
                                                                                {"n_embd", c.n_embd},
                                                                                {"block_size", c.block_size},
                                                                                {"vocab_size", c.vocab_size},
                                                                                {"bias", 1},
                                                                                {"tie_embeddings", 1}})
    h5::write_attr(cfg.id(), key, v);
  h5::write_attr(cfg.id(), "gelu", std::string("erf"));
  h5::write_attr(cfg.id(), "ln_eps", 1e-5);
  h5::Handle params = h5::create_group(f.id(), "params", path);
  const ParamLayout layout(c);
  for (const TensorInfo& t : layout.tensors()) {
    const std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
    h5::Handle d(
        H5Dcreate2(params.id(), t.name.c_str(), H5T_IEEE_F32LE, space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    REQUIRE(H5Dwrite(d.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data() + t.offset) >= 0);
  }
  f.close();
}
}  // namespace

TEST_CASE("a checkpoint read by slices and hashed by blocks gives the whole vector's values and hash", "[checkpoint]") {
  ModelConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 8, c.block_size = 8, c.vocab_size = 13;
  const std::int64_t P = ParamLayout(c).size();
  std::vector<float> flat(static_cast<std::size_t>(P));
  for (std::int64_t i = 0; i < P; ++i) flat[std::size_t(i)] = float(i % 1024) * 0.25f - float(i / 1024);  // exact
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gnh-slices-" + std::to_string(getpid()) + ".h5"));
  write_checkpoint(path, c, flat, flat);
  // Blocks of 7 values (partial rows of every 2-D tensor) and of the default size.
  REQUIRE(verify_param_hash(path, 7) == params_sha256(flat));
  REQUIRE(verify_param_hash(path) == params_sha256(flat));
  // Slices starting and ending inside rows, across tensors, empty and whole.
  for (std::int64_t lo : {std::int64_t(0), std::int64_t(1), std::int64_t(5), std::int64_t(107), P - 3, P})
    for (std::int64_t len : {std::int64_t(0), std::int64_t(1), std::int64_t(9), std::int64_t(130), P}) {
      const std::int64_t hi = std::min(P, lo + len);
      CAPTURE(lo, hi);
      const std::vector<float> got = read_param_slice(path, lo, hi);
      REQUIRE(got == std::vector<float>(flat.begin() + lo, flat.begin() + hi));
    }
  REQUIRE_THROWS_WITH(read_param_slice(path, 3, P + 1), Catch::Contains("a slice [3, " + std::to_string(P + 1)));
  // A value changed after conversion: the streamed hash says so.
  std::vector<float> changed = flat;
  changed[std::size_t(P / 2)] += 1.0f;
  write_checkpoint(path, c, changed, flat);
  REQUIRE_THROWS_WITH(verify_param_hash(path, 64), Catch::Contains("the file was changed after conversion"));
  std::filesystem::remove(path);
}
