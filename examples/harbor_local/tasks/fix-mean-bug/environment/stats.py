"""Print the mean of the numbers given on the command line."""
import sys


def mean(values):
    total = 0
    for v in values[1:]:
        total += v
    return total / len(values)


if __name__ == "__main__":
    numbers = [float(x) for x in sys.argv[1:]]
    print(mean(numbers))
