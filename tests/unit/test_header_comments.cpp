// Every source file's header comment says where its test lives ("Tested in tests/unit/...");
// this checks, on the source tree, that each tests/... path cited in the header comment of a file
// under kernels/, lib/, tools/, tests/ or scripts/ exists, so a moved or renamed test cannot
// leave a comment pointing nowhere. The header comment is the leading run of `//` lines (C++,
// CUDA), of `#` lines after any shebang (shell, Bats, CMake, Python), or a Python module
// docstring. The checker itself is tested on made-up headers first, so it can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = MT_SOURCE_DIR;

enum class CommentStyle { none, slashes, hashes, python };

CommentStyle comment_style(const fs::path& path) {
  const std::string ext = path.extension().string(), name = path.filename().string();
  for (const char* e : {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc"}) {
    if (ext == e) return CommentStyle::slashes;
  }
  if (ext == ".py") return CommentStyle::python;
  for (const char* e : {".sh", ".bash", ".bats", ".cmake"}) {
    if (ext == e) return CommentStyle::hashes;
  }
  return name == "CMakeLists.txt" ? CommentStyle::hashes : CommentStyle::none;
}

std::string trim_left(const std::string& line) {
  const size_t first = line.find_first_not_of(" \t");
  return first == std::string::npos ? std::string() : line.substr(first);
}

// The header comment of a file's text: its leading comment lines (or docstring), joined.
std::string header_comment(const std::string& text, CommentStyle style) {
  std::istringstream in(text);
  std::string line, header;
  bool first = true, in_docstring = false;
  while (std::getline(in, line)) {
    const std::string stripped = trim_left(line);
    const bool shebang = first && stripped.rfind("#!", 0) == 0;
    first = false;
    if (shebang) continue;
    if (in_docstring) {
      header += line + "\n";
      if (stripped.find("\"\"\"") != std::string::npos) break;
      continue;
    }
    if (stripped.empty() && header.empty()) continue;
    const bool slashes = stripped.rfind("//", 0) == 0;
    const bool hashes = stripped.rfind("#", 0) == 0;
    if ((style == CommentStyle::slashes && slashes) || (style != CommentStyle::slashes && hashes)) {
      header += line + "\n";
    } else if (style == CommentStyle::python && header.empty() && stripped.rfind("\"\"\"", 0) == 0) {
      header += line + "\n";
      if (stripped.find("\"\"\"", 3) != std::string::npos) break;  // a one-line docstring
      in_docstring = true;
    } else {
      break;
    }
  }
  return header;
}

// The tests/... paths a text cites (trailing sentence punctuation is not part of a path).
std::vector<std::string> cited_test_paths(const std::string& text) {
  static const std::regex path(R"((^|[^A-Za-z0-9_./-])(tests/[A-Za-z0-9_./-]*[A-Za-z0-9_/]))");
  std::vector<std::string> paths;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), path); it != std::sregex_iterator(); ++it) {
    paths.push_back((*it)[2].str());
  }
  return paths;
}

// "file: cites tests/x, which does not exist" for each cited path missing under `root`.
std::vector<std::string> missing_citations(const fs::path& root, const std::string& file, const std::string& text,
                                           CommentStyle style) {
  std::vector<std::string> problems;
  for (const std::string& cited : cited_test_paths(header_comment(text, style))) {
    if (!fs::exists(root / cited)) problems.push_back(file + ": cites " + cited + ", which does not exist");
  }
  return problems;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(HeaderComments, CheckerFindsHeadersAndCitations) {
  const std::string cpp =
      "// A thing. Tested in tests/unit/test_header_comments.cpp and\n"
      "// tests/unit/core/test_nothing_here.cpp.\n"
      "#pragma once\n"
      "// Not the header any more: tests/unit/core/test_elsewhere.cpp\n";
  EXPECT_EQ(cited_test_paths(header_comment(cpp, CommentStyle::slashes)),
            (std::vector<std::string>{"tests/unit/test_header_comments.cpp", "tests/unit/core/test_nothing_here.cpp"}));
  EXPECT_EQ(missing_citations(kRoot, "x.h", cpp, CommentStyle::slashes),
            (std::vector<std::string>{"x.h: cites tests/unit/core/test_nothing_here.cpp, which does not exist"}));

  const std::string shell = "#!/usr/bin/env bash\n# Run by tests/tools/no_such.bats, see tests/golden/.\nset -e\n";
  EXPECT_EQ(cited_test_paths(header_comment(shell, CommentStyle::hashes)),
            (std::vector<std::string>{"tests/tools/no_such.bats", "tests/golden/"}));
  EXPECT_EQ(missing_citations(kRoot, "x.sh", shell, CommentStyle::hashes).size(), 1u);

  const std::string python = "#!/usr/bin/python3\n\"\"\"Used by\ntests/tools/golden.bats.\"\"\"\nimport os\n";
  EXPECT_EQ(cited_test_paths(header_comment(python, CommentStyle::python)),
            (std::vector<std::string>{"tests/tools/golden.bats"}));
  EXPECT_EQ(cited_test_paths(header_comment("\"\"\"One line: tests/a.py.\"\"\"\n# tests/b.py\n", CommentStyle::python)),
            (std::vector<std::string>{"tests/a.py"}));
  EXPECT_TRUE(cited_test_paths("see mytests/unit/x.cpp or data/tests/y").empty());
}

TEST(HeaderComments, EveryCitedTestPathExists) {
  std::vector<std::string> problems;
  size_t files = 0, citations = 0;
  for (const char* top : {"kernels", "lib", "tools", "tests", "scripts"}) {
    ASSERT_TRUE(fs::is_directory(kRoot / top)) << kRoot / top;
    for (auto it = fs::recursive_directory_iterator(kRoot / top); it != fs::recursive_directory_iterator(); ++it) {
      const std::string name = it->path().filename().string();
      if (it->is_directory() && (name.front() == '.' || name == "__pycache__")) {
        it.disable_recursion_pending();
        continue;
      }
      const CommentStyle style = comment_style(it->path());
      if (!it->is_regular_file() || style == CommentStyle::none) continue;
      const std::string text = read_file(it->path());
      const std::string file = fs::relative(it->path(), kRoot).string();
      ++files;
      citations += cited_test_paths(header_comment(text, style)).size();
      const auto found = missing_citations(kRoot, file, text, style);
      problems.insert(problems.end(), found.begin(), found.end());
    }
  }
  EXPECT_GT(files, 100u);
  EXPECT_GT(citations, 50u);  // the headers do cite their tests: the scan sees them
  std::sort(problems.begin(), problems.end());
  std::string all;
  for (const auto& p : problems) all += "\n  " + p;
  EXPECT_TRUE(problems.empty()) << problems.size() << " header comment(s) cite a test path that does not exist:" << all;
}

}  // namespace
