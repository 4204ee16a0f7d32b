#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The function-length check (.ci/check-functions) on planted sources: each
form of definition it must measure, each brace it must not take for a body,
and the 80-line limit at its edge."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".ci", "check-functions")


def body(lines, indent="  "):
    """`lines` statements, one per line."""
    return "".join(f"{indent}x += {i};\n" for i in range(lines))


class CheckFunctions(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def check(self, source, *args, name="planted.cpp"):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(source) if not source.startswith(" ") else source)
        r = subprocess.run([sys.executable, CHECK, *args, path], capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout

    def lengths(self, source, name="planted.cpp"):
        """{function name: length} as the check measures them."""
        rc, out = self.check(source, "--all", name=name)
        self.assertEqual(rc, 0, out)
        found = {}
        for line in out.splitlines():
            length, where = line.split(None, 1)
            found[where.split(": ", 1)[1]] = int(length)
        return found

    def test_the_limit_is_80_lines_from_signature_to_closing_brace(self):
        # 1 signature line + 78 statements + 1 closing brace = 80: passes.
        rc, out = self.check("int at_limit(int x) {\n" + body(77) + "  return x;\n}\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("1 function(s), none over 80 lines", out)
        # 81 lines: reported with file:line and name, exit 1.
        rc, out = self.check("\n\nint over(int x) {\n" + body(78) + "  return x;\n}\n")
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"planted\.cpp:3: over is 81 lines \(at most 80\)")
        # A two-line signature counts from its first line.
        rc, out = self.check("int two_lines(int x,\n              int y) {\n" + body(78) + "}\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("two_lines is 81 lines", out)

    def test_forms_of_definition(self):
        src = (
            "namespace gnh {\nnamespace {\n"
            "template <class T>\nT twice(T v) {\n  return v + v;\n}\n"
            "}  // namespace\n"
            "class Engine : public Base<int> {\n public:\n"
            "  Engine(int a, int b) : a_(a), b_{b}, c_{} {\n" + body(3, "    ") + "  }\n"
            "  int look(bool& stuck) const noexcept {\n" + body(4, "    ") + "    return 0;\n  }\n"
            "  KOKKOS_INLINE_FUNCTION void operator()(const int i) const {\n    y(i) = 0;\n  }\n"
            "  auto width() const -> int { return 1; }\n"
            "  Engine(const Engine&) = delete;\n"
            "  struct Inner {\n    void f() {}\n  };\n"
            " private:\n  int a_ = 0, b_{1}, c_;\n};\n"
            "template <class T>\nGpt<T>::Gpt(const ModelConfig& cfg, const Shape& shape)\n"
            "    : cfg_(cfg), shape_{shape} {\n  plan();\n}\n"
            "template <class T>\ntypename Gpt<T>::template Act2<T> Gpt<T>::act2(int i) const {\n  return {};\n}\n"
            'extern "C" void on_signal(int) { flag = 1; }\n'
            'extern "C" {\nint c_function(void) {\n  return 0;\n}\n}\n'
            "bool operator==(const A& a, const A& b) { return a.x == b.x; }\n"
            "}  // namespace gnh\n"
        )
        self.assertEqual(
            self.lengths(src),
            {"twice": 4, "Engine::Engine": 5, "Engine::look": 7, "Engine::operator()": 3, "Engine::width": 1,
             "Engine::Inner::f": 1, "Gpt<T>::Gpt": 5, "Gpt<T>::act2": 4, "on_signal": 1, "c_function": 3,
             "operator==": 1})

    def test_lambdas_and_local_classes_count_with_their_function(self):
        src = (
            "void launch(int n) {\n"
            "  auto f = [&](int i) {\n" + body(40, "    ") + "  };\n"
            "  Kokkos::parallel_for(n, KOKKOS_LAMBDA(const int i) {\n" + body(40, "    ") + "  });\n"
            "  struct Local { int g() { return 1; } };\n"
            "}\n"
        )
        rc, out = self.check(src)
        self.assertEqual(rc, 1, out)
        self.assertIn("launch is 87 lines", out)
        self.assertNotIn("Local", out)

    def test_braces_that_are_no_body(self):
        # Initialisers, enums, braces in strings, raw strings, characters and
        # comments, and the other branch of a conditional: none is a function,
        # and none unbalances the scan.
        long_list = "".join(f"    {i},\n" for i in range(100))
        src = (
            "const std::vector<int> kValues = {\n" + long_list + "};\n"
            "enum class Kind {\n" + "".join(f"  k{i},\n" for i in range(90)) + "};\n"
            "struct Table { int v[2]; } table{{1, 2}};\n"
            "auto lambda_at_namespace_scope = [](int x) {\n" + body(90) + "  return x;\n};\n"
            "int strings() {\n"
            '  const char* s = "{ not a brace {";\n'
            '  const char* r = R"x({ raw { string)x";\n'
            "  char c = '{';\n"
            "  // { a comment brace\n"
            "  /* { another\n     { */\n"
            "#if defined(ONE)\n  if (a) {\n#else\n  if (b) {\n#endif\n    return 1;\n  }\n"
            "  return 0;\n"
            "}\n"
            "int after() { return 2; }\n"
        )
        self.assertEqual(self.lengths(src), {"strings": 16, "after": 1})

    def test_control_statements_inside_are_not_functions(self):
        src = "int f(int n) {\n  for (int i = 0; i < n; ++i) {\n    if (i) {\n      n++;\n    }\n  }\n  return n;\n}\n"
        self.assertEqual(self.lengths(src), {"f": 8})

    def test_the_tree_as_ci_runs_it(self):
        # From anywhere: the script finds src/ and apps/ of its checkout.
        r = subprocess.run([sys.executable, CHECK], capture_output=True, text=True, timeout=120, cwd=self.tmp.name)
        self.assertIn("function(s)", r.stdout)
        self.assertIn(r.returncode, (0, 1))


if __name__ == "__main__":
    unittest.main()
