def add_bench_arguments(p):
    pass


def run_bench(a):
    return 0
