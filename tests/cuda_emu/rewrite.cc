// cuemu_rewrite IN OUT: turns a CUDA source into C++ that compiles against cuemu's headers, by
// rewriting only what C++ cannot parse:
//   NAME<<<CONFIG>>>(ARGS)  ->  ::cuemu::Launch("NAME", __FILE__, __LINE__, CONFIG)(
//                                   [](auto... cuemu_a) { NAME(cuemu_a...); }, ARGS)
//   __shared__ T x[N];      ->  static ::cuemu::SharedSlot cuemu_shared_L_I;
//                               auto& x = cuemu_shared_L_I.get<T[N]>();
//   extern __shared__ T x[];->  T* const x = ::cuemu::dynamic_shared<T>();
// Everything else is copied byte for byte; every line keeps its number (a #line directive names
// the original file), so compiler messages, source_location and cuemu's reports point at the .cu.
// Comments, string and character literals are skipped. Anything it cannot rewrite safely is an
// error naming the file and line.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Source {
  std::string path;
  std::string text;
  // Whether text[i] is code (not inside a comment or a literal).
  std::vector<bool> code;

  int line_of(std::size_t pos) const {
    int line = 1;
    for (std::size_t i = 0; i < pos && i < text.size(); ++i) line += text[i] == '\n';
    return line;
  }
  [[noreturn]] void fail(std::size_t pos, const std::string& why) const {
    std::cerr << "cuemu_rewrite: " << path << ":" << line_of(pos) << ": " << why << "\n";
    std::exit(1);
  }
};

void classify(Source& s) {
  const std::string& t = s.text;
  s.code.assign(t.size(), true);
  std::size_t i = 0;
  while (i < t.size()) {
    if (t.compare(i, 2, "//") == 0) {
      while (i < t.size() && t[i] != '\n') s.code[i++] = false;
    } else if (t.compare(i, 2, "/*") == 0) {
      const std::size_t end = t.find("*/", i + 2);
      const std::size_t stop = end == std::string::npos ? t.size() : end + 2;
      while (i < stop) s.code[i++] = false;
    } else if (t.compare(i, 2, "R\"") == 0 &&
               (i == 0 ||
                !(std::isalnum(static_cast<unsigned char>(t[i - 1])) || t[i - 1] == '_'))) {
      const std::size_t paren = t.find('(', i + 2);
      const std::string delim = ")" + t.substr(i + 2, paren - i - 2) + "\"";
      const std::size_t end = t.find(delim, paren);
      const std::size_t stop = end == std::string::npos ? t.size() : end + delim.size();
      while (i < stop) s.code[i++] = false;
    } else if (t[i] == '"' || t[i] == '\'') {
      // A digit separator (1'000) is not a character literal.
      if (t[i] == '\'' && i > 0 && std::isxdigit(static_cast<unsigned char>(t[i - 1]))) {
        ++i;
        continue;
      }
      const char q = t[i];
      s.code[i++] = false;
      while (i < t.size() && t[i] != q) {
        if (t[i] == '\\') s.code[i++] = false;
        if (i < t.size()) s.code[i++] = false;
      }
      if (i < t.size()) s.code[i++] = false;
    } else {
      ++i;
    }
  }
}

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::size_t newlines(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string collapse(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      space = false;
      out += c;
    }
  }
  return out;
}

// The index just past the bracket that closes the one at `open` (any of ( [ {), skipping
// non-code.
std::size_t match_close(const Source& s, std::size_t open) {
  int depth = 0;
  for (std::size_t i = open; i < s.text.size(); ++i) {
    if (!s.code[i]) continue;
    const char c = s.text[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (--depth == 0) return i + 1;
    }
  }
  s.fail(open, "unbalanced brackets");
}

// The start of the kernel name before `<<<` at `pos`: an identifier with optional ::
// qualifiers and one template argument list.
std::size_t name_start(const Source& s, std::size_t pos) {
  std::size_t i = pos;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s.text[i - 1]))) --i;
  if (i > 0 && s.text[i - 1] == '>') {  // template arguments: back to the matching '<'
    int depth = 0;
    while (i > 0) {
      --i;
      if (!s.code[i]) continue;
      if (s.text[i] == '>') ++depth;
      if (s.text[i] == '<' && --depth == 0) break;
    }
    if (depth != 0) s.fail(pos, "cannot find the start of the kernel's template arguments");
  }
  for (;;) {
    while (i > 0 && ident_char(s.text[i - 1])) --i;
    if (i >= 2 && s.text.compare(i - 2, 2, "::") == 0) {
      i -= 2;
      continue;
    }
    break;
  }
  if (i == pos || (!ident_char(s.text[i]) && s.text[i] != ':'))
    s.fail(pos, "no kernel name before <<<");
  return i;
}

struct Edit {
  std::size_t begin, end;
  std::string text;
};

void rewrite_launches(const Source& s, std::vector<Edit>& edits) {
  const std::string& t = s.text;
  for (std::size_t pos = t.find("<<<"); pos != std::string::npos; pos = t.find("<<<", pos + 3)) {
    if (!s.code[pos]) continue;
    const std::size_t start = name_start(s, pos);
    const std::string name = t.substr(start, pos - start);
    // The configuration ends at the first >>> outside brackets.
    std::size_t cfg_end = std::string::npos;
    int depth = 0;
    for (std::size_t i = pos + 3; i + 2 < t.size(); ++i) {
      if (!s.code[i]) continue;
      const char c = t[i];
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') --depth;
      if (depth == 0 && t.compare(i, 3, ">>>") == 0) {
        cfg_end = i;
        break;
      }
    }
    if (cfg_end == std::string::npos) s.fail(pos, "<<< without a matching >>>");
    const std::string config = t.substr(pos + 3, cfg_end - pos - 3);
    std::size_t open = cfg_end + 3;
    while (open < t.size() && std::isspace(static_cast<unsigned char>(t[open]))) ++open;
    if (open >= t.size() || t[open] != '(') s.fail(pos, "no argument list after >>>");
    const std::size_t close = match_close(s, open);
    const std::string between = t.substr(cfg_end + 3, open - cfg_end - 3);
    const std::string args = t.substr(open + 1, close - open - 2);
    bool empty_args = true;
    for (char c : args) empty_args = empty_args && std::isspace(static_cast<unsigned char>(c));
    std::string out = "::cuemu::Launch(\"" + collapse(name) + "\", __FILE__, __LINE__, " + config +
                      ")" + between + "([](auto... cuemu_a) { " + name + "(cuemu_a...); }" +
                      (empty_args ? args : ", " + args) + ")";
    edits.push_back({start, close, out});
  }
}

std::string alignment_of(std::string& type) {
  for (const char* kw : {"alignas", "__align__"}) {
    const std::size_t at = type.find(kw);
    if (at == std::string::npos) continue;
    const std::size_t open = type.find('(', at);
    const std::size_t close = type.find(')', open);
    const std::string n = type.substr(open + 1, close - open - 1);
    type.erase(at, close + 1 - at);
    return n;
  }
  return "";
}

void rewrite_shared(const Source& s, std::vector<Edit>& edits) {
  const std::string& t = s.text;
  const std::string kw = "__shared__";
  int serial = 0;
  for (std::size_t pos = t.find(kw); pos != std::string::npos; pos = t.find(kw, pos + kw.size())) {
    if (!s.code[pos] || (pos > 0 && ident_char(t[pos - 1])) ||
        (pos + kw.size() < t.size() && ident_char(t[pos + kw.size()]))) {
      continue;
    }
    // `extern` before it?
    std::size_t begin = pos;
    bool is_extern = false;
    {
      std::size_t i = pos;
      while (i > 0 && std::isspace(static_cast<unsigned char>(t[i - 1]))) --i;
      if (i >= 6 && t.compare(i - 6, 6, "extern") == 0 && (i == 6 || !ident_char(t[i - 7]))) {
        is_extern = true;
        begin = i - 6;
      }
    }
    const std::size_t semi = t.find(';', pos);
    if (semi == std::string::npos) s.fail(pos, "a __shared__ declaration without ';'");
    const std::string decl = t.substr(pos + kw.size(), semi - pos - kw.size());
    if (decl.find(',') != std::string::npos || decl.find('=') != std::string::npos ||
        (decl.find('(') != std::string::npos && decl.find("alignas") == std::string::npos &&
         decl.find("__align__") == std::string::npos)) {
      s.fail(pos, "unsupported __shared__ declaration (one variable, no initializer): " +
                      collapse(decl));
    }
    // NAME is the last identifier before the array bounds.
    const std::size_t bracket = decl.find('[');
    std::string head = decl.substr(0, bracket == std::string::npos ? decl.size() : bracket);
    const std::string dims = bracket == std::string::npos ? "" : decl.substr(bracket);
    std::size_t e = head.size();
    while (e > 0 && std::isspace(static_cast<unsigned char>(head[e - 1]))) --e;
    std::size_t b = e;
    while (b > 0 && ident_char(head[b - 1])) --b;
    if (b == e) s.fail(pos, "cannot find the name in a __shared__ declaration: " + collapse(decl));
    const std::string name = head.substr(b, e - b);
    std::string type = head.substr(0, b);
    const std::string align = alignment_of(type);
    type = collapse(type);
    std::string out;
    const int line = s.line_of(pos);
    if (is_extern) {
      if (collapse(dims) != "[]")
        s.fail(pos, "extern __shared__ must be an unsized array: " + collapse(decl));
      out = type + "* const " + name + " = ::cuemu::dynamic_shared<" + type + ">();";
    } else {
      const std::string slot =
          "cuemu_shared_" + std::to_string(line) + "_" + std::to_string(serial++);
      out = "static ::cuemu::SharedSlot " + slot + "; auto& " + name + " = " + slot + ".get<" +
            type + collapse(dims) + (align.empty() ? "" : ", " + align) + ">();";
    }
    out += std::string(newlines(t.substr(begin, semi + 1 - begin)), '\n');
    edits.push_back({begin, semi + 1, out});
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: cuemu_rewrite IN.cu OUT.cc\n";
    return 2;
  }
  Source s;
  s.path = argv[1];
  std::ifstream in(s.path, std::ios::binary);
  if (!in) {
    std::cerr << "cuemu_rewrite: cannot read " << s.path << "\n";
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  s.text = ss.str();
  classify(s);
  std::vector<Edit> edits;
  rewrite_launches(s, edits);
  rewrite_shared(s, edits);
  std::sort(edits.begin(), edits.end(),
            [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
  std::string out = "#line 1 \"" + s.path + "\"\n";
  std::size_t at = 0;
  for (const Edit& e : edits) {
    if (e.begin < at) s.fail(e.begin, "overlapping rewrites (a launch inside a launch?)");
    out += s.text.substr(at, e.begin - at);
    out += e.text;
    at = e.end;
  }
  out += s.text.substr(at);
  std::ofstream o(argv[2], std::ios::binary);
  o << out;
  if (!o) {
    std::cerr << "cuemu_rewrite: cannot write " << argv[2] << "\n";
    return 1;
  }
  return 0;
}
