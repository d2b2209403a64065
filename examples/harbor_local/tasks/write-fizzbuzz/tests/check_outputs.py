import subprocess
import sys


def ref(n):
    return "\n".join("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
                      for i in range(1, n + 1))
for n in (1, 15, 31):
    out = subprocess.run([sys.executable, "/app/fizzbuzz.py", str(n)], capture_output=True, text=True, timeout=10)
    if out.stdout.strip() != ref(n):
        sys.exit(1)
