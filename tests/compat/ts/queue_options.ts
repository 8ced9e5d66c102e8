// A Queue with default job options, and jobs added with per-job options: what a user reads back.
import { Queue } from "bunqueue/client";
import { connection, queueName, report } from "./_common";

const queue = new Queue(queueName("options"), {
  connection,
  defaultJobOptions: { attempts: 4, removeOnComplete: false },
});
const plain = await queue.add("plain", { n: 1 });
const rich = await queue.add("rich", { n: 2 }, { priority: 7, delay: 60_000, jobId: "ts-custom-1" });
const got = await queue.getJob(plain.id);
const delayed = await queue.getJob(rich.id);
const counts = await queue.getJobCounts();
const ages = [got!.timestamp, delayed!.timestamp].map((t) => Date.now() - t);
report({
  typeofTimestamp: typeof got!.timestamp,
  age: ages[0],
  isoDate: new Date(got!.timestamp).toISOString(),
  json: JSON.stringify(got).length > 0,
  plain: { name: got!.name, data: got!.data, attempts: got!.opts.attempts },
  rich: { id: delayed!.id, name: delayed!.name, priority: delayed!.opts.priority, delay: delayed!.delay },
  typeofDelay: typeof delayed!.delay,
  richState: await queue.getJobState(rich.id),
  counts,
});
