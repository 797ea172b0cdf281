"""A radix-cache scheduler loop in plain Python over kvhal.CacheManager: requests share system prompts; each is
admitted (match + lock, allocate what is not cached, evicting when pages run short), decoded, and finished
(cache_finished_suffix); the manager's integrity is checked as it goes and hit rates are printed."""
import random
import sys

import kvhal


def main(groups=8, per_group=16, system_len=512, question_len=64, output_len=32, pages=12000, batch=4):
    rng = random.Random(14)
    systems = [[rng.randrange(32000) for _ in range(system_len)] for _ in range(groups)]
    queue = [systems[rng.randrange(groups)] + [rng.randrange(32000) for _ in range(question_len)]
             for _ in range(groups * per_group)]
    cm = kvhal.CacheManager(pages, 1, "radix")
    running, hit, total, done = [], 0, 0, 0
    while queue or running:
        while queue and len(running) < batch:  # admit
            prompt = queue.pop(0)
            handle, cached, _ = cm.match(prompt)
            try:
                own = list(cm.allocate(len(prompt) - cached))
            except kvhal.OutOfMemory:
                cm.unlock(handle)  # always: a request that matched nothing holds a handle too
                queue.insert(0, prompt)
                break
            hit += cached
            total += len(prompt)
            running.append({"handle": handle, "cached": cached, "tokens": list(prompt), "own": own})
        for r in running:  # one decode step: a new token and its page
            r["tokens"].append(rng.randrange(32000))
            r["own"].extend(cm.allocate(1))
        for r in [r for r in running if len(r["tokens"]) - system_len - question_len >= output_len]:
            cm.cache_finished_suffix(r["handle"], r["tokens"][r["cached"]:], r["own"])
            running.remove(r)
            done += 1
        cm.check_integrity()
    print(f"{done} requests, prompt tokens served from the cache: {hit}/{total} ({100.0 * hit / total:.1f}%), "
          f"pages evicted {cm.pages_evicted}, free {cm.num_free}/{pages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
