// upsertJobScheduler every 500 ms: the jobs it makes reach a worker; then it is removed.
import { Queue, Worker } from "bunqueue/client";
import { connection, queueName, report, until } from "./_common";

const name = queueName("sched");
const queue = new Queue(name, { connection });
const info = await queue.upsertJobScheduler("ts-every", { every: 500 }, { name: "tick", data: { k: "v" } });
const seen: { name: string; data: unknown }[] = [];
const worker = new Worker(name, async (j) => { seen.push({ name: j.name, data: j.data }); }, {
  connection,
  skipStalledCheck: true,
});
const enough = await until(() => seen.length >= 2, 15_000);
const listed = await queue.getJobSchedulers();
const removed = await queue.removeJobScheduler("ts-every");
const after = await queue.getJobScheduler("ts-every");
await worker.close();
report({
  info: info === null ? null : { id: info.id, every: info.every, nextIsNumber: typeof info.next === "number" },
  enough,
  seen: seen.slice(0, 2),
  listed: listed.map((s) => s.id),
  removed,
  after,
});
