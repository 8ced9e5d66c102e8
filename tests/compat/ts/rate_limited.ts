// A queue limited to 2 jobs per second: when each of 6 jobs reaches the worker.
import { Queue, Worker } from "bunqueue/client";
import { connection, queueName, report, until } from "./_common";

const name = queueName("rate");
const queue = new Queue(name, { connection });
await queue.setGlobalRateLimitAsync(2, 1000);
await queue.addBulk(Array.from({ length: 6 }, (_, i) => ({ name: "r", data: { i } })));
const starts: number[] = [];
const pulled: number[] = []; // the server's clock: when it handed each job out
const errors: string[] = [];
const worker = new Worker(name, async (job) => {
  starts.push(Date.now());
  pulled.push(Number(job.processedOn));
}, {
  connection,
  concurrency: 4,
  skipStalledCheck: true,
});
worker.on("error", (err) => errors.push(String(err)));
const done = await until(() => starts.length >= 6, 20_000);
await worker.close();
report({ done, starts, pulled, errors });
