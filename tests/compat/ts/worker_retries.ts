// A Worker whose handler fails twice, then succeeds; the retries and the finished job as seen.
import { Queue, Worker } from "bunqueue/client";
import { connection, queueName, report, until } from "./_common";

const name = queueName("retries");
const queue = new Queue(name, { connection });
const job = await queue.add("flaky", { x: 1 }, { attempts: 3, backoff: 50 });
const attemptsSeen: number[] = [];
const failed: string[] = [];
const errors: string[] = [];
let completed: { result: unknown; processedOn: unknown; finishedOn: unknown } | null = null;
const worker = new Worker(
  name,
  async (j) => {
    attemptsSeen.push(j.attemptsMade);
    await j.updateProgress(40);
    if (attemptsSeen.length < 3) throw new Error(`boom ${attemptsSeen.length}`);
    return { ok: true, took: Date.now() - j.timestamp };
  },
  { connection, skipStalledCheck: true },
);
worker.on("failed", (_j, err) => failed.push(err.message));
worker.on("error", (err) => errors.push(String(err)));
worker.on("completed", (j, result) => {
  completed = { result, processedOn: typeof j.processedOn, finishedOn: typeof j.finishedOn };
});
const done = await until(() => completed !== null, 20_000);
const final = await queue.getJob(job.id);
await worker.close();
report({
  done,
  attemptsSeen,
  failed,
  errors,
  completed,
  state: await queue.getJobState(job.id),
  progress: final?.progress,
  returnvalue: final?.returnvalue,
  finishedAge: typeof final?.finishedOn === "number" ? Date.now() - final.finishedOn : null,
});
